"""The OpenAI surface on the fake engine (which echoes its prompt, one token per character,
every logprob -1.53): completions with token-id prompts, `echo`, `logprobs` and `n`; chat's
`n`; the range checks; `stream_options`; GET /v1/models/{id}; and streamed tool calls whose
joined pieces equal the non-streamed arguments for many splits, tools and tool_choice."""

from __future__ import annotations

import pytest

from tests.server.fake_engine import BOS, token_id
from tests.server.test_openai_routes import USER, _events, oai

LP = -1.53  # the fake's LOGPROB as JSON writes it (f32)


def _completion(http, **body):
    return http.post("/v1/completions", json={"max_tokens": 3, **body})


def test_token_id_prompts_are_taken_as_given(http, live):
    ids = [token_id(c) for c in "abc"]
    r = _completion(http, prompt=ids)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "abc"
    assert live.engine.submitted[-1].prompt_ids == tuple(ids)  # no BOS added to ids
    r = _completion(http, prompt=[ids, [token_id("x")]])
    assert [c["text"] for c in r.json()["choices"]] == ["abc", "x"]
    assert r.json()["usage"]["prompt_tokens"] == 4
    r = _completion(http, prompt=[1, 2**40])
    assert r.status_code == 422 and "invalid value" in r.json()["error"]["message"]
    r = _completion(http, prompt=[5, 10**7])
    message = "Input validation error: token id 10000000 is outside the vocabulary"
    assert r.status_code == 422 and r.json()["error"]["message"].startswith(message)
    for bad in ([[1], "a"], [[]], [True, 1]):
        r = _completion(http, prompt=bad)
        assert r.status_code == 422, bad


def test_logprobs_without_echo(http):
    r = _completion(http, prompt="ab", logprobs=2)
    (choice,) = r.json()["choices"]
    lists = choice["logprobs"]
    assert lists["tokens"] == ["a", "b", "</s>"]  # EOS ends the fake's echo
    assert lists["token_logprobs"] == [LP, LP, LP]
    # the two best alternatives (the fake's ids i + 0, i + 1) plus the chosen token
    assert lists["top_logprobs"][0] == {"a": LP, "b": LP}
    assert lists["text_offset"] == [0, 1, 2]
    assert _completion(http, prompt="ab").json()["choices"][0]["logprobs"] is None


def test_echo_with_logprobs_scores_the_prompt(make_client):
    client, engine = make_client(enable_prefill_logprobs=True)
    ids = [token_id(c) for c in "hey"]
    r = client.post(
        "/v1/completions", json={"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1}
    )
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == "hey" + "h"
    lists = choice["logprobs"]
    assert lists["tokens"] == ["h", "e", "y", "h"]  # the prompt's tokens, then the generated one
    assert lists["token_logprobs"] == [None, LP, LP, LP]
    assert lists["top_logprobs"][0] is None
    assert lists["top_logprobs"][1] == {"f": LP, "e": LP}  # alternative i + 1, and the token
    assert lists["text_offset"] == [0, 1, 2, 3]
    assert engine.submitted[-1].prompt_logprobs is True
    # max_tokens 0 with echo: the prompt scored, nothing generated (lm-eval's old requests)
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0}
    r = client.post("/v1/completions", json=body)
    (choice,) = r.json()["choices"]
    assert choice["text"] == "hey" and choice["logprobs"]["tokens"] == ["h", "e", "y"]
    assert choice["finish_reason"] == "length"
    assert r.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_echo_rules(http, live):
    r = _completion(http, prompt="ab", echo=True)
    assert r.json()["choices"][0]["text"] == "abab"
    r = _completion(http, prompt="ab", echo=True, stream=True)
    events = _events(r.text)
    assert events[0]["choices"][0]["text"] == "ab"  # the prompt first
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "abab"
    r = _completion(http, prompt="ab", echo=True, logprobs=1)  # needs prompt logprobs
    assert r.status_code == 422 and "--enable-prefill-logprobs" in r.json()["error"]["message"]
    r = _completion(http, prompt="ab", echo=True, logprobs=1, stream=True)
    assert r.status_code == 422 and "not supported when streaming" in r.text
    r = _completion(http, prompt="ab", max_tokens=0)  # only with echo
    assert r.status_code == 422 and "`max_new_tokens` must be strictly positive" in r.text
    r = _completion(http, prompt="ab", logprobs=6)
    assert r.json() == oai(
        422, "Input validation error: `logprobs` must be >= 0 and <= 5. Given: 6", "validation"
    )
    assert all(req.prompt_ids[0] == BOS for req in live.engine.submitted)


def test_n_choices_on_completions(http, live):
    r = _completion(http, prompt=["ab", "cd"], n=2, seed=7, temperature=1.0)
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["text"] for c in choices] == ["ab", "ab", "cd", "cd"]  # prompt-major
    seeds = [req.sampling.seed for req in live.engine.submitted]
    assert sorted(seeds) == [7, 7, 8, 8]  # choice j: seed + j
    assert r.json()["usage"]["completion_tokens"] == 12
    r = _completion(http, prompt="ab", n=2, stream=True, stream_options={"include_usage": True})
    *chunks, usage, done = _events(r.text)
    for index in (0, 1):
        mine = [c for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["choices"][0]["text"] for c in mine) == "ab"
        assert [c["choices"][0]["finish_reason"] for c in mine] == [None, None, "length"]
    assert usage["usage"]["completion_tokens"] == 6 and done == "[DONE]"
    r = _completion(http, prompt="ab", n=0)
    assert r.status_code == 422 and "`n` must be strictly positive" in r.text
    r = _completion(http, prompt=["a", "b"], n=5)  # 10 choices > 8 permits: never servable
    assert r.status_code == 422 and "--max-concurrent-requests" in r.text


def test_n_choices_on_chat(http, live):
    body = {"messages": USER, "max_tokens": 2, "n": 3}
    r = http.post("/v1/chat/completions", json=body)
    choices = r.json()["choices"]
    assert [(c["index"], c["message"]["content"]) for c in choices] == [
        (0, "<|"), (1, "<|"), (2, "<|")
    ]  # fmt: skip
    assert r.json()["usage"]["completion_tokens"] == 6 and len(live.engine.submitted) == 3
    r = http.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = _events(r.text)[:-1]
    for index in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["delta"]["content"] for c in mine) == "<|"
        assert mine[0]["delta"]["role"] == "assistant" and "role" not in mine[1]["delta"]
    r = http.post("/v1/chat/completions", json={**body, "n": 9})
    assert r.json() == oai(
        422, "Input validation error: `n` must be >= 1 and <= 8. Given: 9", "validation"
    )


def test_stream_options_models_and_tool_choice_rules(http, live):
    for path, body in (
        ("/v1/chat/completions", {"messages": USER}),
        ("/v1/completions", {"prompt": "a"}),
    ):
        r = http.post(path, json={**body, "stream_options": {"include_usage": True}})
        message = "Input validation error: `stream_options` can only be set when `stream` is true"
        assert (r.status_code, r.json()) == (422, oai(422, message, "validation")), path
    r = http.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "required"})
    assert r.status_code == 422 and "`tools` is empty" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": USER, "tool_choice": "none"})
    assert r.status_code == 200
    assert live.engine.submitted[-1].grammar is None
    r = http.get("/v1/models/fake/echo")
    assert r.json() == {"id": "fake/echo", "object": "model", "created": 0, "owned_by": "fake/echo"}
    r = http.get("/v1/models/other")
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model `other` does not exist",
        "type": "model_not_found",
        "param": None,
        "code": 404,
    }


def test_ids_are_unique(http):
    ids = {
        http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).json()["id"]
        for _ in range(5)
    }
    assert len(ids) == 5 and all(i.startswith("cmpl-") for i in ids)


def test_the_openai_sdk_reads_errors(live):
    from openai import OpenAI, UnprocessableEntityError

    client = OpenAI(base_url=f"{live.url}/v1", api_key="-", max_retries=0)
    with pytest.raises(UnprocessableEntityError) as info:
        client.completions.create(model="tgi", prompt="a", logprobs=9)
    assert info.value.type == "validation" and info.value.code == 422
    assert (
        info.value.body["message"]
        == "Input validation error: `logprobs` must be >= 0 and <= 5. Given: 9"
    )
    out = client.completions.create(model="tgi", prompt=[[token_id("z")]], max_tokens=2, logprobs=1)
    assert out.choices[0].text == "z" and out.choices[0].logprobs.token_logprobs == [LP, LP]
