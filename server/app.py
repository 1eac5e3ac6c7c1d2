"""`build_app(engine, settings)`: the Starlette application with TGI's and OpenAI's routes.

The engine object is injected (no jax here): it provides `tokenizer`, `limits`, `model_id`,
`submit()`, `cancel()`, `healthy()`, `stats()` and `shutdown()`. Optional attributes used
when present: `pipeline_tag` and `model_sha` (for /info and `/`'s return_full_text default),
`compute_type` (the x-compute-type header; env COMPUTE_TYPE wins) and `grammar_compiler`
(a tgix.grammar.GrammarCompiler; absent or None: every grammar is refused).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Route

from server import chat_routes, completions_routes, generate_routes, info_routes
from server.admission import Drain, Permits
from server.invocations import invocations
from server.metrics import EngineGauges, RequestMetrics, StepRecorder, record_step
from server.middleware import ApiKeyMiddleware, DrainMiddleware, FramingMiddleware
from server.openai_errors import OpenAIErrorMiddleware
from server.settings import Settings
from server.sse import KEEP_ALIVE_S
from server.state import ServerState
from server.validation import Validator

ROUTES = [
    Route("/", info_routes.health, methods=["GET"]),
    Route("/", generate_routes.compat, methods=["POST"]),
    Route("/generate", generate_routes.generate, methods=["POST"]),
    Route("/generate_stream", generate_routes.generate_stream, methods=["POST"]),
    Route("/tokenize", generate_routes.tokenize, methods=["POST"]),
    Route("/v1/chat/completions", chat_routes.chat_completions, methods=["POST"]),
    Route("/chat_tokenize", chat_routes.chat_tokenize, methods=["POST"]),
    Route("/v1/completions", completions_routes.completions, methods=["POST"]),
    Route("/invocations", invocations, methods=["POST"]),
    Route("/health", info_routes.health, methods=["GET"]),
    Route("/ping", info_routes.health, methods=["GET"]),
    Route("/info", info_routes.info, methods=["GET"]),
    Route("/metrics", info_routes.prometheus, methods=["GET"]),
    Route("/v1/models", info_routes.models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", info_routes.model, methods=["GET"]),  # ids hold "/"
    Route("/api-doc/openapi.json", info_routes.openapi, methods=["GET"]),
    Route("/docs", info_routes.docs, methods=["GET"]),
]


async def _empty_status(request, exc) -> Response:
    """TGI answers unknown paths (404) and wrong methods (405) with an empty body."""
    return Response(status_code=exc.status_code, headers=getattr(exc, "headers", None))


def build_app(
    engine,
    settings: Settings,
    *,
    steps: StepRecorder = record_step,
    keep_alive_s: float = KEEP_ALIVE_S,
) -> Starlette:
    """The ASGI app serving `engine` under `settings`. `steps` is the StepRecorder the engine
    reports its steps to (exposed on /metrics); `keep_alive_s` is the SSE keep-alive period."""
    limits = engine.limits
    registry = CollectorRegistry()
    registry.register(EngineGauges(engine, limits))
    drain = Drain()
    state = ServerState(
        engine=engine,
        settings=settings,
        limits=limits,
        validator=Validator(
            engine.tokenizer,
            limits,
            settings,
            getattr(engine, "grammar_compiler", None),
            vision=getattr(engine, "vision", None),
        ),
        permits=Permits(settings.max_concurrent_requests),
        drain=drain,
        metrics=RequestMetrics(limits, registry),
        registry=registry,
        steps=steps,
        keep_alive_s=keep_alive_s,
        model_id=engine.model_id,
        pipeline_tag=getattr(engine, "pipeline_tag", None),
        compute_type=os.environ.get("COMPUTE_TYPE")
        or getattr(engine, "compute_type", None)
        or "gpu+optimized",
    )
    middleware = [Middleware(FramingMiddleware)]
    if settings.cors_allow_origin:
        headers = ["content-type"] + (["authorization"] if settings.api_key else [])
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.cors_allow_origin),
                allow_methods=["GET", "POST"],
                allow_headers=headers,
            )
        )
    middleware.append(Middleware(OpenAIErrorMiddleware))  # wraps the two below: /v1/* bodies
    if settings.api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=settings.api_key))
    middleware.append(Middleware(DrainMiddleware, drain=drain))
    app = Starlette(
        routes=ROUTES,
        middleware=middleware,
        exception_handlers={404: _empty_status, 405: _empty_status},
    )
    app.state.tgix = state
    return app
