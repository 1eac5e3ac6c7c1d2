"""The OpenAPI 3 document served at /api-doc/openapi.json: every route this server has, with
the request and response schemas TGI publishes for them (written by hand, kept small)."""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _nullable(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], **extra}


_STR, _INT, _NUM, _BOOL = ({"type": t} for t in ("string", "integer", "number", "boolean"))
_STRS = {"type": "array", "items": _STR}

_TOKEN = _obj(["id", "text", "logprob", "special"], id=_INT, text=_STR, logprob=_NUM, special=_BOOL)
_PARAMS = _obj(
    [],
    best_of=_nullable("integer", minimum=1),
    temperature=_nullable("number", exclusiveMinimum=0),
    repetition_penalty=_nullable("number", exclusiveMinimum=0),
    frequency_penalty=_nullable("number", minimum=-2, maximum=2),
    top_k=_nullable("integer", exclusiveMinimum=0),
    top_p=_nullable("number", exclusiveMinimum=0, exclusiveMaximum=1),
    typical_p=_nullable("number", exclusiveMinimum=0, exclusiveMaximum=1),
    do_sample={"type": "boolean", "default": False},
    max_new_tokens=_nullable("integer", minimum=1),
    return_full_text=_nullable("boolean"),
    stop={**_STRS, "maxItems": 4},
    truncate=_nullable("integer", minimum=1),
    watermark={"type": "boolean", "default": False},
    details={"type": "boolean", "default": False},
    decoder_input_details={"type": "boolean", "default": False},
    seed=_nullable("integer", minimum=0),
    top_n_tokens=_nullable("integer", minimum=0),
    grammar={"oneOf": [_ref("GrammarType"), {"type": "null"}]},
    adapter_id=_nullable("string"),
)
_DETAILS = _obj(
    ["finish_reason", "generated_tokens", "prefill", "tokens"],
    finish_reason={"type": "string", "enum": ["length", "eos_token", "stop_sequence"]},
    generated_tokens=_INT,
    seed=_nullable("integer"),
    prefill={"type": "array", "items": _obj(["id", "text"], id=_INT, text=_STR, logprob=_NUM)},
    tokens={"type": "array", "items": _ref("Token")},
    best_of_sequences={"type": "array", "items": {"type": "object"}},
    top_tokens={"type": "array", "items": {"type": "array", "items": _ref("Token")}},
)
_MESSAGE = _obj(["role"], role=_STR, content={"oneOf": [_STR, {"type": "array"}]}, name=_STR)
_CHAT = _obj(
    ["messages"],
    model=_nullable("string"),
    messages={"type": "array", "items": _MESSAGE},
    max_tokens=_nullable("integer"),
    temperature=_nullable("number"),
    top_p=_nullable("number"),
    frequency_penalty=_nullable("number"),
    presence_penalty=_nullable("number"),
    seed=_nullable("integer"),
    stop={"oneOf": [_STRS, _STR, {"type": "null"}]},
    stream={"type": "boolean", "default": False},
    stream_options=_obj([], include_usage=_BOOL),
    logprobs=_nullable("boolean"),
    top_logprobs=_nullable("integer"),
    tools=_nullable("array"),
    tool_choice={},
    tool_prompt=_nullable("string"),
    response_format={"oneOf": [_ref("GrammarType"), _ref("ResponseFormat"), {"type": "null"}]},
)
_COMPLETION = _obj(
    ["prompt"],
    model=_nullable("string"),
    prompt={"oneOf": [_STR, _STRS]},
    max_tokens=_nullable("integer"),
    temperature=_nullable("number"),
    top_p=_nullable("number"),
    stream={"type": "boolean", "default": False},
    seed=_nullable("integer"),
    repetition_penalty=_nullable("number"),
    frequency_penalty=_nullable("number"),
    stop={"oneOf": [_STRS, _STR, {"type": "null"}]},
)
_SCHEMAS: dict[str, Any] = {
    "Token": _TOKEN,
    "GenerateParameters": _PARAMS,
    "GenerateRequest": _obj(["inputs"], inputs=_STR, parameters=_ref("GenerateParameters")),
    "CompatGenerateRequest": _obj(
        ["inputs"], inputs=_STR, parameters=_ref("GenerateParameters"), stream=_BOOL
    ),
    "GrammarType": _obj(
        ["type", "value"],
        type={"type": "string", "enum": ["json", "json_object", "json_schema", "regex"]},
        value={},
    ),
    "ResponseFormat": _obj(
        ["type"],
        type={"type": "string", "enum": ["json_object", "json_schema", "text"]},
        json_schema=_obj(["schema"], name=_STR, schema={}, strict=_BOOL),
    ),
    "Details": _DETAILS,
    "GenerateResponse": _obj(["generated_text"], generated_text=_STR, details=_ref("Details")),
    "StreamResponse": _obj(
        ["index", "token"],
        index=_INT,
        token=_ref("Token"),
        top_tokens={"type": "array", "items": _ref("Token")},
        generated_text=_nullable("string"),
        details={"type": ["object", "null"]},
    ),
    "SimpleToken": _obj(["id", "text", "start", "stop"], id=_INT, text=_STR, start=_INT, stop=_INT),
    "ErrorResponse": _obj(["error", "error_type"], error=_STR, error_type=_STR),
    "ChatRequest": _CHAT,
    "CompletionRequest": _COMPLETION,
    "Info": {"type": "object"},
}


def _op(summary: str, body: str | None, response: dict[str, Any], *errors: int) -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": response}}
    if body is not None:
        content = {"application/json": {"schema": _ref(body)}}
        op["requestBody"] = {"required": True, "content": content}
    for status in errors:
        op["responses"][str(status)] = {
            "description": "TGI error",
            "content": {"application/json": {"schema": _ref("ErrorResponse")}},
        }
    return op


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_SSE = {"description": "Server-sent events", "content": {"text/event-stream": {"schema": _STR}}}
_PLAIN = {"description": "OK"}
_GEN_ERRORS = (422, 424, 429, 500)


def document(version: str) -> dict[str, Any]:
    paths = {
        "/": {
            "get": _op("Health check", None, _PLAIN, 503),
            "post": _op(
                "Generate (TGI compat: a list, or SSE with stream)",
                "CompatGenerateRequest",
                _json({"type": "array", "items": _ref("GenerateResponse")}),
                *_GEN_ERRORS,
            ),
        },
        "/generate": {
            "post": _op(
                "Generate", "GenerateRequest", _json(_ref("GenerateResponse")), *_GEN_ERRORS
            )
        },
        "/generate_stream": {"post": _op("Generate a stream", "GenerateRequest", _SSE, 429)},
        "/v1/chat/completions": {
            "post": _op("OpenAI chat", "ChatRequest", _json({"type": "object"}), *_GEN_ERRORS)
        },
        "/v1/completions": {
            "post": _op("OpenAI completions", "CompletionRequest", _json({"type": "object"}), 422)
        },
        "/tokenize": {
            "post": _op(
                "Tokenize",
                "GenerateRequest",
                _json({"type": "array", "items": _ref("SimpleToken")}),
            )
        },
        "/chat_tokenize": {"post": _op("Template and tokenize", "ChatRequest", _json({}), 422)},
        "/invocations": {"post": _op("SageMaker", None, _json({}), *_GEN_ERRORS)},
        "/info": {"get": _op("Server and model info", None, _json(_ref("Info")))},
        "/health": {"get": _op("Health check", None, _PLAIN, 503)},
        "/ping": {"get": _op("Health check", None, _PLAIN, 503)},
        "/metrics": {"get": _op("Prometheus metrics", None, {"description": "text/plain"})},
        "/v1/models": {"get": _op("Served model", None, _json({"type": "object"}))},
        "/v1/models/{model_id}": {
            "get": _op("The served model, or 404", None, _json({"type": "object"}))
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Text Generation Inference",
            "description": "tgix: a TGI-compatible LLM server on JAX",
            "license": {"name": "Apache 2.0"},
            "version": version,
        },
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }
