"""The server over tgix's real Tokenizer (transformers fast tokenizer, sandboxed chat
template): byte offsets on /tokenize, the templated prompt, template errors, and per-thread
tokenizer copies in the validation pool."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from server.app import build_app
from server.metrics import StepRecorder
from server.settings import Settings
from tests.server.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def real_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tgix.testing import write_test_tokenizer
    from tgix.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    write_test_tokenizer(path)
    return Tokenizer(AutoTokenizer.from_pretrained(str(path)))


@pytest.fixture
def client(real_tokenizer):
    engine = FakeEngine()
    engine.tokenizer = real_tokenizer
    app = build_app(engine, Settings(validation_workers=2), steps=StepRecorder())
    with TestClient(app) as client:
        yield client, engine, app


def test_tokenize_offsets_are_utf8_bytes(client, real_tokenizer):
    http, _, _ = client
    text = "héllo wörld 你好"
    tokens = http.post("/tokenize", json={"inputs": text}).json()
    assert [t["id"] for t in tokens] == real_tokenizer.encode(text)
    raw = text.encode()
    for token in tokens:
        assert raw[token["start"] : token["stop"]].decode() == token["text"]
    assert tokens[-1]["stop"] == len(raw)


def test_chat_prompt_comes_from_the_models_template(client, real_tokenizer):
    http, engine, _ = client
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = http.post("/chat_tokenize", json={"messages": messages}).json()
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert out["templated_text"] == expected + "<|im_start|>assistant\n"
    ids = [t["id"] for t in out["tokenize_response"]]
    assert ids == real_tokenizer.encode(out["templated_text"], add_special_tokens=False)

    # a request cannot bring its own template: the field is ignored
    body = {"messages": messages, "chat_template": "{{ 'pwned' }}", "max_tokens": 1}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert list(engine.submitted[0].prompt_ids) == ids

    continued = [*messages, {"role": "assistant", "content": "Sure"}]
    out = http.post("/chat_tokenize", json={"messages": continued}).json()
    assert out["templated_text"] == expected + "<|im_start|>assistant\nSure"


def test_each_validation_thread_has_its_own_tokenizer(client, real_tokenizer):
    http, _, app = client
    for _ in range(6):
        assert http.post("/tokenize", json={"inputs": "hello"}).status_code == 200
    validator = app.state.tgix.validator
    seen = set()

    def grab(tokenizer):
        return id(tokenizer)

    import asyncio

    async def collect():
        return await asyncio.gather(*(validator.run(grab) for _ in range(8)))

    seen.update(asyncio.run(collect()))
    assert id(real_tokenizer) not in seen and 1 <= len(seen) <= 2
