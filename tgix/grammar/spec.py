"""What a request asks for: a regex or a JSON Schema, in one canonical form (the cache key)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """kind "regex": value is the regex source (full match, interegular syntax).
    kind "json": value is the schema as compact JSON text, keys in the order given (property
    order is generation order, so it is part of the identity); build it with
    `GrammarSpec.json(schema)` from a dict, bool or JSON string."""

    kind: Literal["regex", "json"]
    value: str

    @classmethod
    def regex(cls, source: str) -> GrammarSpec:
        return cls("regex", source)

    @classmethod
    def json(cls, schema: Any) -> GrammarSpec:
        """A schema object (dict or bool) or a string holding one; ValueError if not JSON."""
        if isinstance(schema, str):
            schema = json.loads(schema)
        return cls("json", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))

    def schema(self) -> Any:
        return json.loads(self.value)

    def key(self) -> str:
        return f"{self.kind}:{self.value}"
