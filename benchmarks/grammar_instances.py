"""MaskBench instances as text a grammar can accept: `json.dumps` layout, object keys in the
order the schema declares them.

The grammars (tgix's and outlines-core's) fix declared properties in schema order, with
additional members after them, so an instance whose keys came out in another order would be
"rejected" for its layout, not its content. `candidates` gives the as-is serialization and,
when different, one whose keys follow the schema: the properties the schema declares (through
`$ref`, `allOf` parts after the schema's own keys, the best-matching `anyOf` / `oneOf`
branch), then `required` names it does not declare, then the rest in their original order.
Best effort: an instance counts as accepted when either text is.
"""

from __future__ import annotations

import json

_MAX_DEPTH = 32  # $ref chains and nesting followed this deep, no further


def candidates(data, schema) -> list[str]:
    """Distinct texts for one instance: as written, then reordered after the schema."""
    plain = json.dumps(data, ensure_ascii=False)
    ordered = json.dumps(reorder(data, schema, schema), ensure_ascii=False)
    return [plain] if ordered == plain else [plain, ordered]


def reorder(value, schema, root, depth: int = 0):
    """`value` with every object's keys in the order its (sub)schema generates them."""
    if depth > _MAX_DEPTH or not isinstance(value, dict | list):
        return value
    views = _views(schema, root, depth, value)
    if isinstance(value, list):
        return [reorder(v, _item_schema(views, i), root, depth + 1) for i, v in enumerate(value)]
    order: list[str] = []
    subs: dict[str, list] = {}
    for view in views:
        props = view.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                order.append(name)
                subs.setdefault(name, []).append(sub)
    for view in views:
        required = view.get("required")
        if isinstance(required, list):
            order.extend(r for r in required if isinstance(r, str))
    extra = next((v["additionalProperties"] for v in views if "additionalProperties" in v), {})
    keys = [k for k in dict.fromkeys(order) if k in value]
    keys += [k for k in value if k not in keys]
    out = {}
    for key in keys:
        sub = subs[key][0] if key in subs else extra
        out[key] = reorder(value[key], sub, root, depth + 1)
    return out


def _views(schema, root, depth: int, value) -> list[dict]:
    """The schemas whose keywords apply to `value`, flattened in the order tgix merges them:
    a `$ref` target before its siblings, the schema's own keywords before its `allOf` parts,
    then the `anyOf` / `oneOf` branch that fits `value` best."""
    if depth > _MAX_DEPTH or not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        target = resolve_ref(root, schema["$ref"])
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _views(target, root, depth + 1, value) + _views(rest, root, depth + 1, value)
    views = [{k: v for k, v in schema.items() if k not in ("allOf", "anyOf", "oneOf")}]
    for part in schema.get("allOf") or ():
        views += _views(part, root, depth + 1, value)
    for word in ("anyOf", "oneOf"):
        branches = [_views(b, root, depth + 1, value) for b in schema.get(word) or ()]
        if branches:
            views += max(branches, key=lambda b: _fit(b, value))
    return views


def _fit(views: list[dict], value) -> tuple[int, int]:
    """How well a branch fits: (its types admit the value, value keys it declares)."""
    kind = "object" if isinstance(value, dict) else "array"
    typed = [v["type"] for v in views if "type" in v]
    type_ok = all(t == kind or (isinstance(t, list) and kind in t) for t in typed)
    declared = {n for v in views if isinstance(v.get("properties"), dict) for n in v["properties"]}
    overlap = len(declared & set(value)) if isinstance(value, dict) else 0
    return int(type_ok), overlap


def _item_schema(views: list[dict], i: int):
    for view in views:
        prefix = view.get("prefixItems")
        items = view.get("items")
        if isinstance(prefix, list) and i < len(prefix):
            return prefix[i]
        if isinstance(items, list):
            if i < len(items):
                return items[i]
            continue
        if isinstance(items, dict):
            return items
    return {}


def resolve_ref(root, ref):
    """A local `#/...` JSON pointer inside `root`; {} when it cannot be followed."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return {}
    node = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node
