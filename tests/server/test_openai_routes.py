"""Golden tests of the OpenAI-compatible routes (§2.6, §2.7), /chat_tokenize and
/invocations. The fake template renders `<|role|>content\\n...<|assistant|>` and the fake
engine echoes the prompt, so outputs are predictable."""

from __future__ import annotations

import json

import pytest

USER = [{"role": "user", "content": "Hi"}]
PROMPT = "<|user|>Hi\n<|assistant|>"


def oai(status: int, message: str, error_type: str) -> dict:
    """The OpenAI SDK's error body, as /v1/* writes it (TGI's status and message)."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


def _events(text: str) -> list:
    frames = [f for f in text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [f[6:] if f == "data: [DONE]" else json.loads(f[6:]) for f in frames]


def test_chat_golden_bytes(http, live):
    r = http.post("/v1/chat/completions", json={"model": "tgi", "messages": USER, "max_tokens": 4})
    assert r.status_code == 200
    body = r.json()
    created, rid = body["created"], body["id"]
    assert rid.startswith("chatcmpl-") and len(rid) > 20
    n = len(PROMPT)
    assert r.text == (
        f'{{"object":"chat.completion","id":"{rid}","created":{created},"model":"fake/echo",'
        '"system_fingerprint":"0.1.0-native","choices":[{"index":0,"message":{"role":"assistant",'
        '"content":"<|us"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":'
        f'{n},"completion_tokens":4,"total_tokens":{n + 4}}}}}'
    )
    (req,) = live.engine.submitted
    assert req.prompt_ids[0] != 1  # templated prompt: no BOS added
    assert req.sampling.do_sample is True and req.sampling.temperature == 1.0  # chat samples
    assert int(r.headers["x-prompt-tokens"]) == len(PROMPT)


def test_chat_maps_openai_parameters(http, live):
    body = {
        "model": "my-model",
        "messages": USER,
        "temperature": 0,
        "top_p": 1,
        "seed": 3,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "stop": "|",
        "max_completion_tokens": 9,
        "logit_bias": {"1": 2},
        "n": 1,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "my-model"
    (req,) = live.engine.submitted
    s = req.sampling
    assert (s.do_sample, s.temperature, s.top_p, s.seed) == (False, 1.0, 1.0, 3)
    assert (s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (0.5, 0.25, 1.0)
    assert req.stop == ("|",) and req.max_new_tokens == 9


def test_chat_stop_sequence_is_cut_and_reported_as_stop(http):
    body = {"messages": USER, "stop": ["Hi"], "max_tokens": 50}
    out = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert out["message"]["content"] == "<|user|>" and out["finish_reason"] == "stop"

    r = http.post("/v1/chat/completions", json={**body, "stream": True})
    events = _events(r.text)
    streamed = "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
    assert streamed == "<|user|>"  # the held-back "H" of "Hi" never went out
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_chat_stream_golden_bytes_with_usage_and_logprobs(http):
    body = {
        "messages": USER,
        "max_tokens": 2,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 1,
        "stream_options": {"include_usage": True},
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.headers["content-type"] == "text/event-stream"
    created, rid = _events(r.text)[0]["created"], _events(r.text)[0]["id"]
    assert rid.startswith("chatcmpl-")  # one id, shared by every chunk of the stream
    head = (
        f'{{"object":"chat.completion.chunk","id":"{rid}","created":{created},"model":"fake/echo",'
        '"system_fingerprint":"0.1.0-native","choices":'
    )

    def lp(t: str) -> str:
        top = f'"top_logprobs":[{{"token":"{t}","logprob":-1.53}}]'
        return f'{{"content":[{{"token":"{t}","logprob":-1.53,{top}}}]}}'

    assert r.text == (
        f'data: {head}[{{"index":0,"delta":{{"role":"assistant","content":"<"}},"logprobs":'
        f'{lp("<")},"finish_reason":null}}],"usage":null}}\n\n'
        f'data: {head}[{{"index":0,"delta":{{"content":"|"}},"logprobs":'
        f'{lp("|")},"finish_reason":"length"}}],"usage":null}}\n\n'
        f'data: {head}[],"usage":{{"prompt_tokens":{len(PROMPT)},"completion_tokens":2,'
        f'"total_tokens":{len(PROMPT) + 2}}}}}\n\n'
        "data: [DONE]\n\n"
    )


def test_chat_non_stream_logprobs_and_eos(http):
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "text", "text": "b"},
                ],
            }
        ],
        "logprobs": True,
    }
    r = http.post("/v1/chat/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "<|user|>ab\n<|assistant|>"
    assert choice["finish_reason"] == "stop"  # EOS
    content = choice["logprobs"]["content"]
    assert content[-1] == {"token": "</s>", "logprob": -1.53, "top_logprobs": []}


def test_chat_images_on_a_text_only_model_are_a_422(http):
    part = {"type": "image_url", "image_url": {"url": "http://x/i.png"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 422
    assert r.json()["error"] == {
        "code": 422,
        "message": "Input validation error: this model does not take images: it has no vision "
        "encoder",
        "param": None,
        "type": "validation",
    }


def test_chat_validation_errors_inside_the_stream(http, live):
    body = {"messages": USER, "stream": True, "top_logprobs": 9}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.text == (
        'data: {"error":{"message":"Input validation error: `top_n_tokens` must be >= 0 and <= 5. '
        'Given: 9","http_status_code":422}}\n\ndata: [DONE]\n\n'
    )
    r = http.post("/v1/chat/completions", json={"messages": USER, "top_logprobs": 9})
    assert r.status_code == 422 and r.json()["error"]["type"] == "validation"
    assert live.engine.submitted == []


@pytest.mark.parametrize("stream", [False, True])
def test_chat_request_shape_errors_are_http_422(http, stream):
    def post(**extra):
        return http.post("/v1/chat/completions", json={"messages": USER, "stream": stream, **extra})

    r = post(messages=[{"role": "user", "content": "RAISE"}])
    assert (r.status_code, r.json()) == (
        422,
        oai(422, "Template error: Conversation roles must alternate", "template_error"),
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    r = post(tools=tools, response_format={"type": "json", "value": {"properties": {}}})
    assert r.json() == oai(
        422, "Tool error: Grammar and tools are mutually exclusive", "tool_error"
    )
    r = post(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.json() == oai(422, "Tool error: Tool with name nope not found", "tool_error")
    r = post(messages=[{"role": "user", "content": None}])  # TGI: plain text; here OpenAI's
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["message"].startswith("Failed to deserialize the JSON body")
    r = post(stream_options=None, logprobs="yes")
    assert r.status_code == 422 and "logprobs: invalid type" in r.json()["error"]["message"]


def test_no_chat_template(make_client):
    from tests.server.fake_engine import FakeEngine

    client, _ = make_client(FakeEngine(chat_template=None))
    r = client.post("/v1/chat/completions", json={"messages": USER})
    assert r.json() == oai(422, "Template error: template not found", "template_error")


def test_continue_final_assistant_message(http, live):
    messages = [*USER, {"role": "assistant", "content": "Sure"}]
    http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    prompt = "".join(chr(i - 10) for i in live.engine.submitted[0].prompt_ids)
    assert prompt == "<|user|>Hi\n<|assistant|>Sure"


def test_chat_tokenize(http):
    r = http.post("/chat_tokenize", json={"messages": USER})
    out = r.json()
    assert list(out) == ["tokenize_response", "templated_text"]
    assert out["templated_text"] == PROMPT
    assert out["tokenize_response"][0] == {"id": ord("<") + 10, "text": "<", "start": 0, "stop": 1}
    assert len(out["tokenize_response"]) == len(PROMPT)


def test_completions_several_prompts(http, live):
    r = http.post("/v1/completions", json={"prompt": ["ab", "xyz"], "max_tokens": 2, "seed": 1})
    created, rid = r.json()["created"], r.json()["id"]
    assert rid.startswith("cmpl-")
    assert r.text == (
        f'{{"object":"text_completion","id":"{rid}","created":{created},"model":"fake/echo",'
        '"system_fingerprint":"0.1.0-native","choices":[{"index":0,"text":"ab","logprobs":null,'
        '"finish_reason":"length"},{"index":1,"text":"xy","logprobs":null,"finish_reason":'
        '"length"}],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}'
    )
    assert r.headers["x-prompt-tokens"] == "7" and r.headers["x-generated-tokens"] == "4"
    assert all(req.prompt_ids[0] == 1 for req in live.engine.submitted)  # special tokens added


def test_ignore_eos_is_vllms_extension_on_openai_routes(http, live):
    """`ignore_eos` (vLLM's field, for fixed-length benchmarks) reaches the engine; it is
    off unless given, and a non-boolean is refused like any mistyped field."""
    http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "ignore_eos": True})
    chat = {"messages": USER, "max_tokens": 2}
    http.post("/v1/chat/completions", json={**chat, "ignore_eos": True})
    http.post("/v1/chat/completions", json=chat)
    assert [r.ignore_eos for r in live.engine.submitted[-3:]] == [True, True, False]
    r = http.post("/v1/completions", json={"prompt": "ab", "ignore_eos": "yes"})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert message.endswith('ignore_eos: invalid type: string "yes", expected a boolean')


def test_completions_stream_interleaves_and_ends_with_done(http):
    r = http.post("/v1/completions", json={"prompt": ["ab", "cd"], "max_tokens": 2, "stream": True})
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    keys = ["object", "id", "created", "model", "system_fingerprint", "choices", "usage"]
    assert list(chunks[0]) == keys and len({c["id"] for c in chunks}) == 1
    for index, text in ((0, "ab"), (1, "cd")):
        mine = [c for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["choices"][0]["text"] for c in mine) == text
        # OpenAI's: null until the last (TGI: "" and its own words), usage only on request
        assert [c["choices"][0]["finish_reason"] for c in mine] == [None, "length"]
        assert all(c["usage"] is None for c in mine)
    body = {"prompt": ["ab", "cd"], "max_tokens": 2, "stream": True}
    r = http.post("/v1/completions", json={**body, "stream_options": {"include_usage": True}})
    *chunks, last, done = _events(r.text)
    assert done == "[DONE]" and last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}
    assert all(c["usage"] is None for c in chunks)


def test_completions_errors(http, live):
    r = http.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert r.content == (
        b'{"error":{"message":"Suffix is not supported and can be achieved by preprocessing the '
        b'prompt.","type":"suffix not supported","param":null,"code":422}}'
    )
    r = http.post("/v1/completions", json={"prompt": ["a"] * 4})
    assert r.status_code == 422
    message = "Number of prompts exceeds the maximum allowed batch size of 3"
    assert r.json() == oai(422, message, "batch size exceeded")
    r = http.post("/v1/completions", json={"prompt": []})
    assert r.status_code == 422
    assert "Empty array detected. Do not use an empty array for the prompt." in r.text
    r = http.post("/v1/completions", json={"prompt": ["ok", ""], "max_tokens": 2})
    assert r.status_code == 422 and "`inputs` cannot be empty" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"prompt": ["ok", ""], "max_tokens": 2, "stream": True})
    assert r.text.endswith(
        'data: {"error":{"message":"Input validation error: `inputs` cannot be empty",'
        '"http_status_code":422}}\n\ndata: [DONE]\n\n'
    )


def test_invocations_dispatch(http):
    r = http.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}})
    assert r.json() == [{"generated_text": "HiHi"}]
    r = http.post("/invocations", json={"messages": USER, "max_tokens": 1})
    assert r.json()["object"] == "chat.completion"
    r = http.post("/invocations", json={"prompt": "ab", "max_tokens": 1})
    assert r.json()["object"] == "text_completion"
    r = http.post("/invocations", json={"what": 1})
    assert r.status_code == 422
    assert r.text.endswith("data did not match any variant of untagged enum SagemakerRequest")
