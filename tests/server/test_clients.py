"""The real, unmodified clients against the fake-engine server on 127.0.0.1: TGI's
`text-generation`, `huggingface_hub.InferenceClient` and the `openai` SDK, streaming and
not, including typed errors (§7)."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MESSAGES = [{"role": "user", "content": "Hi"}]
CHAT_ECHO = "<|user|>Hi\n<|assistant|>"


def test_text_generation_client(live):
    from text_generation import Client
    from text_generation.errors import ValidationError

    client = Client(live.url, timeout=10)
    response = client.generate("Hello", max_new_tokens=3, decoder_input_details=True)
    assert response.generated_text == "Hel"
    assert response.details.finish_reason == "length" and response.details.generated_tokens == 3
    assert [t.text for t in response.details.tokens] == ["H", "e", "l"]

    responses = list(client.generate_stream("Hello", max_new_tokens=10))
    assert "".join(r.token.text for r in responses if not r.token.special) == "Hello"
    assert responses[-1].generated_text == "Hello"
    assert responses[-1].details.finish_reason == "eos_token"

    with pytest.raises(ValidationError, match="`max_new_tokens` must be <= 256|must be <= 256"):
        client.generate("Hi", max_new_tokens=1000)
    with pytest.raises(ValidationError, match="`top_n_tokens` must be >= 0 and <= 5"):
        list(client.generate_stream("Hi", top_n_tokens=7))


def test_text_generation_async_client(live):
    from text_generation import AsyncClient

    async def run():
        client = AsyncClient(live.url, timeout=10)
        response = await client.generate("Hello", max_new_tokens=2, top_n_tokens=2)
        tokens = [r async for r in client.generate_stream("Hi", max_new_tokens=5)]
        return response, tokens

    response, tokens = asyncio.run(run())
    assert response.generated_text == "He" and len(response.details.top_tokens[0]) == 2
    assert tokens[-1].generated_text == "Hi" and tokens[-1].details.generated_tokens == 3


def test_huggingface_hub_text_generation(live):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import ValidationError

    client = InferenceClient(base_url=live.url, timeout=10)
    assert client.text_generation("Hello", max_new_tokens=3) == "HelloHel"  # `/` echoes the prompt
    out = client.text_generation("Hello", max_new_tokens=3, details=True, return_full_text=False)
    assert out.generated_text == "Hel" and out.details.finish_reason == "length"
    assert [t.id for t in out.details.tokens] == [ord("H") + 10, ord("e") + 10, ord("l") + 10]

    chunks = list(client.text_generation("Hi", max_new_tokens=5, stream=True, details=True))
    assert [c.token.text for c in chunks] == ["H", "i", "</s>"]
    assert chunks[-1].details.finish_reason == "eos_token"
    # without details hf_hub yields every token's text, EOS included, as it does with TGI
    assert "".join(client.text_generation("Hi", max_new_tokens=5, stream=True)) == "Hi</s>"
    with pytest.raises(ValidationError, match="`temperature` must be strictly positive"):
        list(client.text_generation("Hi", temperature=-1.0, stream=True, details=True))


def test_huggingface_hub_chat_completion(live):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=live.url, timeout=10)
    out = client.chat_completion(MESSAGES, max_tokens=50, temperature=0)
    assert out.choices[0].message.content == CHAT_ECHO
    assert (
        out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == len(CHAT_ECHO) + 1
    )
    chunks = list(client.chat_completion(MESSAGES, max_tokens=4, stream=True))
    assert "".join(c.choices[0].delta.content for c in chunks) == CHAT_ECHO[:4]
    chunks = list(
        client.chat_completion(
            MESSAGES, max_tokens=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2


def test_openai_sdk(live):
    import openai

    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="-", max_retries=0)
    chat = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=5, stop=["|a"])
    assert chat.choices[0].message.content == "<|use"
    assert chat.choices[0].finish_reason == "length" and chat.usage.prompt_tokens == len(CHAT_ECHO)

    stream = client.chat.completions.create(
        model="tgi",
        messages=MESSAGES,
        max_tokens=50,
        stream=True,
        stop=["Hi"],
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "<|user|>"
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage.total_tokens > 0
    assert chunks[0].choices[0].logprobs.content[0].top_logprobs[0].logprob == -1.53

    completion = client.completions.create(model="tgi", prompt=["ab", "cd"], max_tokens=2)
    assert [c.text for c in completion.choices] == ["ab", "cd"]
    streamed = list(client.completions.create(model="tgi", prompt="abc", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == "abc"

    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(
            model="tgi", messages=MESSAGES, top_logprobs=9, logprobs=True
        )
    with pytest.raises(openai.APIError, match="`top_n_tokens` must be >= 0 and <= 5"):
        list(
            client.chat.completions.create(
                model="tgi", messages=MESSAGES, stream=True, top_logprobs=9, logprobs=True
            )
        )
