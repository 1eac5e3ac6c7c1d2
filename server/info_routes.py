"""The non-generation routes: health (/health, /ping, GET /), /info, /v1/models (and
/v1/models/{id}), /metrics and the OpenAPI document.

/health is 200 with an empty body only while the engine reports healthy (warmed up and steps
completing) and the server is not draining; otherwise 503 with TGI's healthcheck body.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import errors, metrics
from server.errors import ApiError
from server.generate_routes import json_response
from server.openapi import document
from server.state import of, version


async def health(request: Request) -> Response:
    st = of(request)
    if st.drain.draining or not st.engine.healthy():  # type: ignore[attr-defined]
        return errors.unhealthy().response()
    return Response(status_code=200)


async def info(request: Request) -> Response:
    st = of(request)
    s = st.settings
    return json_response(
        {
            "model_id": st.model_id,
            "model_sha": getattr(st.engine, "model_sha", None),
            "model_pipeline_tag": st.pipeline_tag,
            "max_concurrent_requests": s.max_concurrent_requests,
            "max_best_of": s.max_best_of,
            "max_stop_sequences": s.max_stop_sequences,
            "max_input_tokens": st.limits.max_input_tokens,
            "max_total_tokens": st.limits.max_total_tokens,
            "validation_workers": s.validation_workers,
            "max_client_batch_size": s.max_client_batch_size,
            "speculate": getattr(st.engine, "speculate", 0),  # draft tokens per decode step
            # the effective method: --quantize, or the checkpoint's (null: the model dtype)
            "quantize": getattr(st.engine, "quantize", s.quantize),
            "kv_cache_dtype": getattr(st.engine, "kv_dtype", None),  # tgix: the KV pages' dtype
            "router": "text-generation-router",
            "version": version(),
            "sha": None,
            "docker_label": None,
        }
    )


def _model_entry(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": model_id}


async def models(request: Request) -> Response:
    return json_response({"object": "list", "data": [_model_entry(of(request).model_id)]})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the served model, or 404 (in OpenAI's error shape, as /v1/*)."""
    model_id = of(request).model_id
    if request.path_params["model_id"] != model_id:
        detail = f"The model `{request.path_params['model_id']}` does not exist"
        return ApiError(404, detail, "model_not_found").response()
    return json_response(_model_entry(model_id))


async def prometheus(request: Request) -> Response:
    st = of(request)
    body = metrics.render(st.registry, st.steps.registry)
    return Response(body, media_type=metrics.CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    return json_response(document(version()))


_DOCS = """<!doctype html><html><head><title>Text Generation Inference</title>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div><script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js">
</script><script>SwaggerUIBundle({url: "/api-doc/openapi.json", dom_id: "#ui"});</script>
</body></html>"""


async def docs(request: Request) -> Response:
    """Swagger UI over /api-doc/openapi.json (the UI's assets load from a CDN)."""
    return HTMLResponse(_DOCS)
