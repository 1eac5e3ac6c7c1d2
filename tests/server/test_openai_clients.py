"""Clients built on the OpenAI API, unmodified, against tgix over the REAL engine (a tiny random
llama) on a real uvicorn server: langchain-openai (invoke, stream, bind_tools,
with_structured_output) and instructor (a nested pydantic model) on a server with room for
tool prompts; lm-evaluation-harness (`local-completions`: loglikelihood and generate_until on
tiny tasks in local files) on the shared session server, its loglikelihoods checked against
transformers on the same weights.

The random model writes whatever the grammar lets it, so schemas bound their strings and
integers: every answer then ends inside the token limit, and greedy answers are exact."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel, Field

from tests.server.real_engine import idle_around, start
from tgix.engine.request import GenerationRequest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOMY_ARGV = [
    "--max-input-tokens",
    "1000",
    "--max-total-tokens",
    "1100",
    "--max-batch-prefill-tokens",
    "1100",
    "--max-batch-total-tokens",
    "2200",
    "--max-batch-size",
    "2",
    "--max-concurrent-requests",
    "8",
]  # fmt: skip (room for the tool prompt and a schema: one request at a time)
USER = [{"role": "user", "content": "Who is it?"}]


class Person(BaseModel):
    """A person."""

    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=99)


class Item(BaseModel):
    sku: str = Field(max_length=3)
    qty: int = Field(ge=1, le=9)


class Order(BaseModel):
    """An order with its items."""

    id: int = Field(ge=0, le=99)
    items: list[Item] = Field(max_length=2)


@pytest.fixture(scope="module")
def roomy(tiny_checkpoints, tmp_path_factory):
    yield from start(tiny_checkpoints, tmp_path_factory, ROOMY_ARGV)


@pytest.fixture
def live(roomy):
    yield from idle_around(roomy)


def _greedy_chat(live, messages, n: int) -> str:
    """The engine's own greedy answer to the templated messages (no special tokens added)."""
    prompt = live.chat_prompt(messages)
    ids = tuple(live.tokenizer.encode(prompt, add_special_tokens=False))
    *_, final = live.engine.submit(GenerationRequest(prompt_ids=ids, max_new_tokens=n))
    return final.generated_text


def _llm(live, **kw):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="tgi", base_url=f"{live.url}/v1", api_key="-", temperature=0, max_retries=0, **kw
    )


def test_langchain_invoke_and_stream(live):
    llm = _llm(live, max_tokens=10)
    reply = llm.invoke(USER[0]["content"])
    assert reply.content == _greedy_chat(live, USER, 10)
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert reply.response_metadata["id"].startswith("chatcmpl-")
    usage = reply.usage_metadata
    chunks = list(_llm(live, max_tokens=10, stream_usage=True).stream(USER[0]["content"]))
    assert "".join(c.content for c in chunks) == reply.content
    merged = sum(chunks[1:], chunks[0])
    assert merged.usage_metadata["total_tokens"] == usage["total_tokens"]  # sent once
    assert merged.response_metadata["finish_reason"] == reply.response_metadata["finish_reason"]


def test_langchain_bind_tools_streamed_equals_invoked(live):
    llm = _llm(live, max_tokens=120).bind_tools([Person], tool_choice="Person")
    reply = llm.invoke(USER[0]["content"])
    assert reply.invalid_tool_calls == []
    (call,) = reply.tool_calls
    assert call["name"] == "Person" and call["id"] == "0"
    Person(**call["args"])  # the grammar kept it inside the schema
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(llm.stream(USER[0]["content"]))
    merged = sum(chunks[1:], chunks[0])
    assert merged.invalid_tool_calls == []
    (streamed,) = merged.tool_calls
    assert (streamed["name"], streamed["args"], streamed["id"]) == ("Person", call["args"], "0")


def test_langchain_structured_output(live):
    person = _llm(live, max_tokens=60).with_structured_output(Person).invoke("Who?")
    assert isinstance(person, Person)
    raw = _llm(live, max_tokens=60).with_structured_output(Person, include_raw=True).invoke("Who?")
    assert raw["parsing_error"] is None and raw["parsed"] == person
    assert json.loads(raw["raw"].content) == person.model_dump()


def test_instructor_nested_model(live):
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(OpenAI(base_url=f"{live.url}/v1", api_key="-"))
    order, completion = client.chat.completions.create_with_completion(
        model="tgi",
        response_model=Order,
        messages=[{"role": "user", "content": "My order?"}],
        max_tokens=200,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(order, Order) and all(isinstance(i, Item) for i in order.items)
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "Order"
    assert json.loads(call.function.arguments) == order.model_dump()


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": Order.model_json_schema(),
        },
    },
]


@pytest.mark.parametrize("seed", range(12))
def test_sampled_tool_calls_stream_what_they_answer(live, seed):
    """Seeded sampling makes the streamed and the non-streamed answer the same text: the
    streamed argument pieces join to the non-streamed `arguments` (or, for `no_tool`, the
    contents match; for a call cut short, both end with the same tool_error)."""
    from openai import OpenAI, UnprocessableEntityError

    client = OpenAI(base_url=f"{live.url}/v1", api_key="-", max_retries=0)
    choice = ["auto", "required", {"type": "function", "function": {"name": "book"}}][seed % 3]
    request = dict(
        model="tgi",
        messages=USER,
        tools=_TOOLS,
        tool_choice=choice,
        temperature=1.0,
        seed=seed,
        max_tokens=120,
    )
    try:
        reply = client.chat.completions.create(**request).choices[0]
    except UnprocessableEntityError as exc:  # cut short by max_tokens: the same, as an event
        body = {**request, "stream": True}
        raw = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60)
        frames = [f[6:] for f in raw.text.split("\n\n") if f]
        assert frames[-1] == "[DONE]" and len(frames) == 2
        assert json.loads(frames[0]) == {
            "error": {"message": exc.body["message"], "http_status_code": 422}
        }
        return
    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    if reply.message.tool_calls is None:  # no_tool: the plain answer, streamed the same
        assert "".join(d.content or "" for d in deltas) == reply.message.content
        return
    (call,) = reply.message.tool_calls
    pieces = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert pieces[0].function.name == call.function.name
    assert "".join(p.function.arguments for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == reply.finish_reason == "tool_calls"


_DATA = [
    {"question": "The capital of France is", "answer": "Paris"},
    {"question": "Two plus two equals", "answer": "four"},
    {"question": "The sky is", "answer": "blue"},
]
_TASKS = {
    "tiny_ll": """task: tiny_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{question}}}}"
doc_to_target: " {{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""",
    "tiny_gen": """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}?\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""",
}


@pytest.fixture
def shared(real_engine):
    yield from idle_around(real_engine)


@pytest.mark.reference
def test_lm_eval_local_completions(shared, tiny_checkpoints, tmp_path, monkeypatch):
    """loglikelihood requests send token ids with echo + logprobs and read the prompt's
    scores back: lm-eval's sums and greedy flags equal transformers' on the same weights;
    generate_until texts equal the engine's greedy continuations cut at the stops."""
    import torch

    from tgix import testing

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _DATA))
    for task, text in _TASKS.items():
        (tmp_path / f"{task}.yaml").write_text(text.format(data=data))

    import lm_eval
    from lm_eval.tasks import TaskManager

    path = tiny_checkpoints("llama")
    result = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{shared.url}/v1/completions",
            "model": "tgi",
            "tokenizer": str(path),
            "tokenizer_backend": "huggingface",
            "max_retries": 1,
            "num_concurrent": 1,
            "batch_size": 1,
        },
        tasks=list(_TASKS),
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        limit=3,
        bootstrap_iters=0,
        log_samples=True,
    )
    tokenizer = shared.tokenizer.hf
    model = testing.load_reference_model(path)
    samples = result["samples"]["tiny_ll"]
    assert len(samples) == 3
    for sample in samples:
        context, continuation = sample["arguments"][0]
        whole = tokenizer.encode(context + continuation, add_special_tokens=False)
        start = len(tokenizer.encode(context, add_special_tokens=False))
        with torch.no_grad():
            logits = model(torch.tensor([whole])).logits[0, :, : testing.TOKENIZER_VOCAB_SIZE]
        logprobs = torch.log_softmax(logits.float(), -1)
        rows = range(start - 1, len(whole) - 1)
        want = sum(float(logprobs[i, whole[i + 1]]) for i in rows)
        greedy = all(int(logprobs[i].argmax()) == whole[i + 1] for i in rows)
        got, got_greedy = sample["resps"][0][0]
        assert got == pytest.approx(want, abs=1e-3) and got_greedy == greedy
    stops = ["\n", ".", tokenizer.eos_token]
    for sample in result["samples"]["tiny_gen"]:
        prompt = sample["arguments"][0][0]
        ids = tuple(tokenizer.encode(prompt, add_special_tokens=False))
        request = GenerationRequest(prompt_ids=ids, max_new_tokens=8, stop=tuple(stops))
        *_, final = shared.engine.submit(request)
        text = final.generated_text
        if final.finish_reason == "stop_sequence":
            text = text[: text.find(final.stop_sequence)]
        assert sample["resps"][0][0] == text


def test_n_choices_share_the_prompts_pages(live):
    """`n` choices are `n` generations of one prompt: all but the first start past its full
    pages (the prefix cache), and greedy choices are identical."""
    page = live.engine.runner.config.page_size
    ids = [(7 * k + 3) % 250 + 20 for k in range(4 * page + 6)]  # a prompt no test used
    before = live.engine.stats()["prefix_hit_tokens"]
    body = {"model": "tgi", "prompt": ids, "max_tokens": 4, "temperature": 0, "n": 4}
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    texts = [c["text"] for c in r.json()["choices"]]
    assert len(texts) == 4 and len(set(texts)) == 1
    shared = (len(ids) - 1) // page * page  # a hit leaves the last token to compute
    assert live.idle()["prefix_hit_tokens"] - before == 3 * shared
