"""Grammar requests (§8.1): the grammar object of the generate routes and chat's
`response_format`, read into one normal form and compiled by the engine's GrammarCompiler.

Normal form: `{"type": "json", "value": schema}` (a schema object or bool, or a string that
holds one) or `{"type": "regex", "value": str}`. Shapes accepted:

- generate `parameters.grammar`, as TGI: `json` / `json_object` with `value`, `json_schema`
  with `value: {"name"?, "schema"}`, `regex` with a string `value`;
- chat `response_format`: the same, plus OpenAI's `{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"?}}`, `{"type": "json_object"}` without `value` (any JSON object)
  and `{"type": "text"}` (no grammar). TGI refuses these three.

Unlike TGI, a JSON Schema needs no top-level `properties`: any schema the compiler supports
is accepted, and one it does not support is a 422 naming the keyword. As in TGI, a top-level
schema with `properties` and no `type` describes an object. Compilation runs in
the compiler's worker processes, so a slow or failing grammar never blocks the event loop or
other requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from server import errors
from server.errors import ApiError
from server.fields import Fields, check, deserialize_error
from tgix.grammar import GrammarError, GrammarSpec
from tgix.grammar.compiler import GrammarBusy

log = logging.getLogger("tgix.server")
COMPILE_DEADLINE_S = 60.0  # a request waits at most this for its grammar (queue + compile)

GRAMMAR_TYPES = ("json", "json_object", "json_schema", "regex")
RESPONSE_FORMAT_TYPES = (*GRAMMAR_TYPES, "text")
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # OpenAI's JSON mode: any JSON object


def _unknown_variant(f: Fields, kind: str, variants: tuple[str, ...]):
    listed = ", ".join(f"`{t}`" for t in variants)
    return deserialize_error(f._path("type"), f"unknown variant `{kind}`, expected one of {listed}")


def _schema_config(value: Any, path: str) -> dict[str, Any]:
    """`{"name"?, "schema", ...}` (TGI's JsonSchemaConfig / OpenAI's json_schema object)."""
    config = Fields(value, "JsonSchemaConfig", path)
    config.optional("name", "str")
    if not config.has("schema"):
        raise deserialize_error(path, "missing field `schema`")
    return {"type": "json", "value": config.value["schema"]}


def _tgi_grammar(g: Fields, kind: str) -> dict[str, Any]:
    if not g.has("value"):
        raise deserialize_error(g.path, "missing field `value`")
    value = g.value["value"]
    if kind == "regex":
        return {"type": "regex", "value": check(value, "str", g._path("value"))}
    if kind == "json_schema":
        return _schema_config(value, g._path("value"))
    return {"type": "json", "value": value}


def parse_grammar(fields: Fields, name: str) -> dict[str, Any] | None:
    """A generate route's `grammar` (TGI's GrammarType), in normal form."""
    g = fields.nested(name, "GrammarType")
    if g is None:
        return None
    kind = g.required("type", "str")
    if kind not in GRAMMAR_TYPES:
        raise _unknown_variant(g, kind, GRAMMAR_TYPES)
    return _tgi_grammar(g, kind)


def parse_response_format(fields: Fields, name: str) -> dict[str, Any] | None:
    """Chat's `response_format`: TGI's shapes and OpenAI's, in normal form (None: text)."""
    g = fields.nested(name, "ResponseFormat")
    if g is None:
        return None
    kind = g.required("type", "str")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise _unknown_variant(g, kind, RESPONSE_FORMAT_TYPES)
    if kind == "text":
        return None
    if kind == "json_schema" and not g.has("value") and g.has("json_schema"):
        return _schema_config(g.value["json_schema"], g._path("json_schema"))
    if kind == "json_object" and not g.has("value"):
        return {"type": "json", "value": ANY_OBJECT}
    return _tgi_grammar(g, kind)


_SHAPED_BY = ("type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not")


def _as_tgi_reads(schema: Any) -> Any:
    """TGI (outlines) turns a schema with `properties` into an object even without `type`, and
    TGI's own example schemas leave it out; JSON Schema would also accept any non-object.
    Read the top level TGI's way."""
    shaped = isinstance(schema, dict) and any(k in schema for k in _SHAPED_BY)
    if isinstance(schema, dict) and "properties" in schema and not shaped:
        return {"type": "object", **schema}
    return schema


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def to_spec(grammar: dict[str, Any]) -> GrammarSpec:
    """The GrammarSpec for a normal-form grammar, or TGI's 422: a JSON value that is not a
    schema is "grammar is not supported", a string that is not JSON "grammar is not valid"."""
    value = grammar["value"]
    if grammar["type"] == "regex":
        return GrammarSpec.regex(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise errors.validation(f"grammar is not valid: {_json_error(exc)}") from None
    if not isinstance(value, dict | bool):
        raise errors.validation("grammar is not supported")
    return GrammarSpec.json(_as_tgi_reads(value))


async def compile_grammar(compiler, disabled: bool, grammar: dict[str, Any]) -> Any:
    """The compiled TokenIndex for a request's grammar. 422 "grammar is not supported" when
    grammars are disabled (--disable-grammar-support) or the tokenizer has no compiler;
    422 with the compiler's message when the grammar cannot be compiled; 429 when the
    compile queue is full or the compile has not finished by COMPILE_DEADLINE_S (it goes on,
    and its result is cached for the next request)."""
    if disabled or compiler is None:
        raise errors.validation("grammar is not supported")
    spec = to_spec(grammar)
    try:
        # shielded: a request that stops waiting must not cancel a compile others share
        return await asyncio.wait_for(
            asyncio.shield(compiler.compile_async(spec)), COMPILE_DEADLINE_S
        )
    except (GrammarBusy, TimeoutError):  # the compile queue is full, or too slow to reach
        raise errors.overloaded() from None
    except GrammarError as exc:
        raise errors.validation(str(exc)) from None
    except ApiError:
        raise
    except Exception as exc:  # the compiler itself broke (a worker died): not the request's fault
        log.exception("grammar compilation failed")
        message = f"Request failed during generation: grammar compilation failed: {exc}"
        raise ApiError(424, message, "generation") from None
