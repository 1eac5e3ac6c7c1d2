"""Typed reads from a parsed JSON body, failing the way TGI's serde structs fail.

TGI deserialises each body into a Rust struct; a wrong type or a missing required field is a
422 with a plain-text body naming the field path ("parameters.top_p: invalid type: string
"x", expected f32"). `Fields` reproduces those checks and messages (without serde's line and
column suffix) so handlers work with plain Python values afterwards. Unknown keys are ignored.
"""

from __future__ import annotations

from typing import Any

from server.errors import PlainError

_INT_BOUNDS = {"u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1), "usize": (0, 2**64 - 1)}
_INT_BOUNDS["i32"] = (-(2**31), 2**31 - 1)
_EXPECTED = {"bool": "a boolean", "str": "a string", "list": "a sequence", "object": "a map"}
_MISSING = object()
_F32_MAX = 3.4028234663852886e38


def describe(value: Any) -> str:
    """serde's `Unexpected` wording for a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    return "map"


def deserialize_error(path: str, message: str) -> PlainError:
    where = f"{path}: " if path else ""
    return PlainError(
        422, f"Failed to deserialize the JSON body into the target type: {where}{message}"
    )


def check(value: Any, kind: str, path: str) -> Any:
    """Check one value against a kind: bool, str, f32, u32, u64, usize, i32, list[str],
    list, object, any. Returns the value (ints stay ints, f32 accepts ints)."""
    if kind == "any":
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "f32" and isinstance(value, int | float) and not isinstance(value, bool):
        if not -_F32_MAX <= value <= _F32_MAX:  # 1e999 parses to inf; 1e39 overflows f32
            raise deserialize_error(path, "invalid value: number out of range, expected f32")
        return float(value)
    if kind in _INT_BOUNDS and isinstance(value, int) and not isinstance(value, bool):
        low, high = _INT_BOUNDS[kind]
        if not low <= value <= high:
            raise deserialize_error(path, f"invalid value: {describe(value)}, expected {kind}")
        return value
    if kind == "list[str]" and isinstance(value, list):
        return [check(v, "str", f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "list" and isinstance(value, list):
        return value
    if kind == "object" and isinstance(value, dict):
        return value
    expected = _EXPECTED.get(kind.split("[")[0], kind)
    raise deserialize_error(path, f"invalid type: {describe(value)}, expected {expected}")


class Fields:
    """One JSON object seen as a Rust struct named `struct_name`."""

    def __init__(self, value: Any, struct_name: str, path: str = ""):
        if not isinstance(value, dict):
            raise deserialize_error(
                path, f"invalid type: {describe(value)}, expected struct {struct_name}"
            )
        self.value = value
        self.path = path

    def _path(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.value

    def required(self, name: str, kind: str) -> Any:
        if name not in self.value:
            raise deserialize_error(self.path, f"missing field `{name}`")
        return check(self.value[name], kind, self._path(name))

    def optional(self, name: str, kind: str, default: Any = None) -> Any:
        """`Option<T>` with `#[serde(default)]`: absent or null -> default."""
        value = self.value.get(name)
        return default if value is None else check(value, kind, self._path(name))

    def flag(self, name: str, default: bool = False) -> bool:
        """A plain `bool` with `#[serde(default)]`: absent -> default, null is a type error."""
        value = self.value.get(name, _MISSING)
        return default if value is _MISSING else check(value, "bool", self._path(name))

    def nested(self, name: str, struct_name: str) -> Fields | None:
        value = self.value.get(name)
        return None if value is None else Fields(value, struct_name, self._path(name))
