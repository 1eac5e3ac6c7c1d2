"""The one exception a grammar can fail with; the server turns it into a 422."""


class GrammarError(ValueError):
    """A grammar that cannot be compiled: bad syntax, an unsupported JSON Schema keyword (named
    in the message), a vocabulary that cannot express it, or a budget exceeded."""
