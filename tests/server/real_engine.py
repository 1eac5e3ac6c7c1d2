"""The HTTP server over the REAL engine (tiny random llama, compiled once per session) on a
real uvicorn server on 127.0.0.1, shared by the real-engine test modules: conftest's
`real_engine` fixture starts it; each module's `live` and `http` fixtures wrap
`idle_around` and `client_for`."""

from __future__ import annotations

import time

import httpx

from server.app import build_app
from server.args import parse_args
from server.metrics import StepRecorder
from tests.server.conftest import LiveServer
from tgix.engine.request import Completion, GenerationRequest

ARGV = [
    "--max-input-tokens", "40",
    "--max-total-tokens", "64",
    "--max-batch-prefill-tokens", "64",
    "--max-batch-total-tokens", "1024",
    "--max-batch-size", "4",
    "--max-concurrent-requests", "32",
    "--enable-prefill-logprobs",  # completions' echo + logprobs (lm-evaluation-harness)
]  # fmt: skip
PROMPT = "What is the time?"
N = 12  # greedy tokens compared everywhere
MESSAGES = [{"role": "user", "content": "Hi"}]


class SlowSteps:
    """The engine's step hook: TGI's step metrics, plus an optional sleep after each step so
    tests can catch requests mid-generation (the tiny model decodes in about a millisecond)."""

    def __init__(self) -> None:
        self.recorder = StepRecorder()
        self.delay = 0.0

    def __call__(self, *args, **kwargs) -> None:
        self.recorder(*args, **kwargs)
        if self.delay:
            time.sleep(self.delay)


def _engine_for(settings, path, xla_cache, hook):
    """What `tgix.serve.build_engine` does, on a local checkpoint and a private XLA cache."""
    from tgix.engine.factory import EngineOptions, create_engine
    from tgix.models import load_model
    from tgix.serve import limit_request
    from tgix.tokenizer import load_tokenizer

    loaded = load_model(str(path))
    limits = limit_request(settings)
    options = EngineOptions(
        compilation_cache=xla_cache,
        progress=False,
        max_top_n_tokens=settings.max_top_n_tokens,
        prompt_logprobs=settings.enable_prefill_logprobs,
    )
    return create_engine(
        loaded,
        load_tokenizer(loaded.files),
        limits,
        options,
        model_id=str(path),
        on_step=hook,
    )


class Real:
    def __init__(self, engine, hook: SlowSteps, server: LiveServer, settings):
        self.engine, self.hook, self.server, self.settings = engine, hook, server, settings
        self.url, self.port, self.state = server.url, server.port, server.state
        self.tokenizer = engine.tokenizer

    def direct(self, text: str, n: int = N, **kw) -> Completion:
        """The engine's own answer for `text` tokenized as /generate does."""
        ids = tuple(self.tokenizer.encode(text, add_special_tokens=True))
        *_, final = self.engine.submit(GenerationRequest(prompt_ids=ids, max_new_tokens=n, **kw))
        assert isinstance(final, Completion)
        return final

    def chat_prompt(self, messages=MESSAGES) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def idle(self, timeout: float = 5.0) -> dict:
        """Nothing queued, running or paged in the engine, and every permit back."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.engine.stats()
            if (
                s
                and s["queue_size"] == 0
                and s["batch_size"] == 0
                and s["used_pages"] == 0
                and self.state.permits.in_use == 0
            ):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"not idle: {s}, permits in use {self.state.permits.in_use}")
            time.sleep(0.01)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def start(tiny_checkpoints, tmp_path_factory, argv: list[str] = ARGV):
    """Build the engine and its server; yields a Real, then stops both."""
    settings = parse_args(argv, environ={})
    hook = SlowSteps()
    xla_cache = str(tmp_path_factory.mktemp("xla-cache-server"))
    engine = _engine_for(settings, tiny_checkpoints("llama"), xla_cache, hook)
    app = build_app(engine, settings, steps=hook.recorder)
    server = LiveServer(app, engine)
    yield Real(engine, hook, server, settings)
    server.stop()
    engine.shutdown()


def idle_around(real: Real):
    """Body of a module's `live` fixture: the shared server, idle before and after a test."""
    real.hook.delay = 0.0
    real.idle()
    yield real
    real.hook.delay = 0.0
    real.idle()


def client_for(real: Real):
    """Body of a module's `http` fixture."""
    with httpx.Client(base_url=real.url, timeout=30) as client:
        yield client
