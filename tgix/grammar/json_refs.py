"""Local `$ref` resolution: JSON pointers (`#/…`, `~0` / `~1`, percent-decoding), `#` (the
root), `$anchor` names (and draft 6/7 `$id: "#name"`), and the `$id`s of schemas embedded in
the document (`other.json`, `other.json#/…`), resolved against the root's `$id`. A reference
to any other document raises `GrammarError` (nothing is fetched)."""

from __future__ import annotations

from urllib.parse import unquote, urljoin

from tgix.grammar.errors import GrammarError

_NOT_SCHEMAS = ("enum", "const", "default", "examples", "example")


class Resolver:
    def __init__(self, root: object):
        self.root = root
        self.base = ""
        self.ids: dict[str, object] = {}
        self.anchors: dict[str, object] = {}
        if isinstance(root, dict):
            root_id = root.get("$id", root.get("id"))
            self.base = root_id if isinstance(root_id, str) else ""
            self._index(root)

    def _index(self, node: object) -> None:
        if isinstance(node, list):
            for item in node:
                self._index(item)
            return
        if not isinstance(node, dict):
            return
        for key in ("$id", "id"):
            value = node.get(key)
            # `id` is also a common property name: only a string next to schema keywords
            if isinstance(value, str) and not isinstance(node.get("type"), dict):
                if value.startswith("#"):
                    self.anchors.setdefault(value[1:], node)
                else:
                    for name in (value, urljoin(self.base, value)):
                        self.ids.setdefault(name.rstrip("#"), node)
        if isinstance(node.get("$anchor"), str):
            self.anchors.setdefault(node["$anchor"], node)
        for key, value in node.items():
            if key not in _NOT_SCHEMAS:
                self._index(value)

    def __call__(self, ref: object) -> object:
        """The schema a `$ref` value points to."""
        if not isinstance(ref, str):
            raise GrammarError("JSON Schema keyword '$ref' must be a string")
        uri, _, fragment = ref.partition("#")
        doc = self.root
        if uri:
            doc = self.ids.get(urljoin(self.base, uri).rstrip("#"), self.ids.get(uri))
            if doc is None:
                raise GrammarError(
                    f"JSON Schema keyword '$ref' to an external document ({ref!r}) is not supported"
                )
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            if fragment not in self.anchors:
                raise GrammarError(f"$ref {ref!r} does not resolve")
            return self.anchors[fragment]
        for token in fragment.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(doc, dict) and token in doc:
                doc = doc[token]
            elif isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
                doc = doc[int(token)]
            else:
                raise GrammarError(f"$ref {ref!r} does not resolve")
        return doc
