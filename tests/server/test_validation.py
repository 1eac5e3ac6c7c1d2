"""Every TGI 422 validation rule (§3.1) with its exact message, the order rules fire in
(§3.2), truncation and the token budget. Limits of the fake engine: 200 input tokens, 256
total; max_best_of 2, max_stop_sequences 4, max_top_n_tokens 5 (TGI's defaults)."""

from __future__ import annotations

import pytest

from tests.server.fake_engine import BOS, token_id

RULES = [
    ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3"),
    ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
    ({"temperature": 0}, "`temperature` must be strictly positive"),
    ({"temperature": -1.5}, "`temperature` must be strictly positive"),
    ({"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive"),
    ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"frequency_penalty": -2.01}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"top_p": 0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"typical_p": 1.0}, "`typical_p` must be > 0.0 and < 1.0"),
    ({"top_k": 0}, "`top_k` must be strictly positive"),
    ({"top_k": -3}, "`top_k` must be strictly positive"),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
    ({"stop": ["a", "x" * 4097]}, "`stop` sequences must be at most 4096 characters. Given: 4097"),
    ({"temperature": 1e-45}, "`temperature` must be >= 1e-06. Given: 1e-45"),
    ({"repetition_penalty": 1e-9}, "`repetition_penalty` must be >= 1e-06. Given: 1e-09"),
    ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
    ({"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
    ({"truncate": 0}, "`truncate` must be strictly positive and less than 200. Given: 0"),
    ({"truncate": 201}, "`truncate` must be strictly positive and less than 200. Given: 201"),
    (
        {"max_new_tokens": 300},
        "`inputs` tokens + `max_new_tokens` must be <= 256. Given: 3 "
        "`inputs` tokens and 300 `max_new_tokens`",
    ),
    (
        {"grammar": {"type": "regex", "value": "BAD"}},
        "cannot compile regex grammar: BAD is not allowed",
    ),
]


@pytest.mark.parametrize(("params", "message"), RULES, ids=[m[:40] for _, m in RULES])
def test_each_rule_answers_422_with_tgis_message(http, live, params, message):
    r = http.post("/generate", json={"inputs": "Hi", "parameters": params})
    assert r.status_code == 422
    assert r.json() == {"error": f"Input validation error: {message}", "error_type": "validation"}
    assert list(r.json()) == ["error", "error_type"]
    assert live.engine.submitted == []


def test_empty_inputs(http):
    r = http.post("/generate", json={"inputs": "", "parameters": {}})
    assert r.status_code == 422
    assert r.json()["error"] == "Input validation error: `inputs` cannot be empty"


def test_too_long_prompt_and_budget(http):
    r = http.post("/generate", json={"inputs": "x" * 210, "parameters": {"max_new_tokens": 10}})
    assert r.json()["error"] == (
        "Input validation error: `inputs` must have less than 200 tokens. Given: 211"
    )
    # without max_new_tokens the budget is the room left; a prompt past max_total fails it
    r = http.post("/generate", json={"inputs": "x" * 300, "parameters": {}})
    assert r.json()["error"] == (
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 256. "
        "Given: 301 `inputs` tokens and 0 `max_new_tokens`"
    )


def test_best_of_disabled_when_max_best_of_is_one(make_client):
    client, _ = make_client(max_best_of=1)
    r = client.post("/generate", json={"inputs": "Hi", "parameters": {"best_of": 2}})
    assert r.json()["error"] == (
        "Input validation error: `best_of` != 1 is not allowed for this endpoint"
    )


def test_rules_fire_in_tgis_order(http):
    # temperature comes before top_p, which comes before stop count, which precedes inputs
    params = {"temperature": 0, "top_p": 2, "stop": ["a"] * 9}
    r = http.post("/generate", json={"inputs": "", "parameters": params})
    assert "`temperature`" in r.json()["error"]
    r = http.post("/generate", json={"inputs": "", "parameters": {"top_p": 2, "stop": ["a"] * 9}})
    assert "`top_p`" in r.json()["error"]
    r = http.post("/generate", json={"inputs": "", "parameters": {"stop": ["a"] * 9}})
    assert "`stop`" in r.json()["error"]
    # budget is checked before the input length
    r = http.post("/generate", json={"inputs": "x" * 250, "parameters": {"max_new_tokens": 10}})
    assert "`inputs` tokens + `max_new_tokens`" in r.json()["error"]


def test_truncate_keeps_the_last_tokens(http, live):
    r = http.post("/generate", json={"inputs": "abcdef", "parameters": {"truncate": 2}})
    assert r.status_code == 200
    assert live.engine.submitted[0].prompt_ids == (token_id("e"), token_id("f"))
    assert r.json()["generated_text"] == "ef"


def test_max_new_tokens_chunk_rule_and_default(http, live):
    # TGI checks the budget against min(max_new_tokens, 1024) ... but 3 + 1024 > 256 here,
    # so use a bigger engine: the fake's max_total is 256, so 253 room is granted silently
    http.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 253}})
    http.post("/generate", json={"inputs": "Hi", "parameters": {}})
    assert [r.max_new_tokens for r in live.engine.submitted] == [253, 253]


def test_budget_uses_a_1024_token_chunk(make_client):
    from tests.server.fake_engine import FakeEngine
    from tgix.engine.request import EngineLimits

    limits = EngineLimits(
        max_input_tokens=2000,
        max_total_tokens=2048,
        max_batch_prefill_tokens=2048,
        max_batch_total_tokens=8192,
        max_batch_size=None,
        max_waiting_tokens=20,
        waiting_served_ratio=0.3,
        page_size=16,
        chunked_prefill=True,
    )
    client, engine = make_client(FakeEngine(limits))
    r = client.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5000}})
    assert r.status_code == 200  # 3 + min(5000, 1024) fits: accepted, silently capped
    assert engine.submitted[0].max_new_tokens == 2045
    r = client.post(
        "/generate", json={"inputs": "x" * 1100, "parameters": {"max_new_tokens": 5000}}
    )
    assert r.status_code == 422 and "Given: 1101 `inputs` tokens and 5000" in r.json()["error"]


def test_sampling_params_reach_the_engine(http, live):
    params = {
        "temperature": 0.5,
        "top_k": 7,
        "top_p": 0.9,
        "typical_p": 0.8,
        "seed": 11,
        "repetition_penalty": 1.2,
        "frequency_penalty": 0.5,
        "watermark": True,
        "stop": ["zz"],
        "top_n_tokens": 2,
        "max_new_tokens": 4,
    }
    assert http.post("/generate", json={"inputs": "Hi", "parameters": params}).status_code == 200
    (req,) = live.engine.submitted
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.typical_p, s.seed) == (0.5, 7, 0.9, 0.8, 11)
    assert (s.repetition_penalty, s.frequency_penalty, s.watermark) == (1.2, 0.5, True)
    assert req.stop == ("zz",) and req.top_n_tokens == 2 and req.max_new_tokens == 4
    assert req.prompt_ids[0] == BOS


def test_tokenization_runs_in_the_validation_pool(http, live):
    http.post("/generate", json={"inputs": "Hi", "parameters": {}})
    assert live.engine.tokenizer.encode_threads
    assert all(t.startswith("tgix-validation") for t in live.engine.tokenizer.encode_threads)
