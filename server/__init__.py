"""tgix's HTTP server: TGI's launcher flags and routes plus OpenAI's, over an injected engine.

Module map: args/settings (flags -> Settings), main (entry point), app (routes + middleware),
generate_routes / chat_routes / completions_routes / invocations / info_routes (handlers),
generation (permit -> validation -> engine -> metrics), validation + schemas + chat + fields
(TGI's request rules), engine_io + sse (engine streams, SSE framing, disconnects),
serialize / openai_format (response shapes), errors, metrics, admission (permits, drain),
lifecycle (uvicorn + SIGTERM drain). No jax here: the engine object is passed in.
"""
