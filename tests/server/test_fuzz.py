"""Property-based fuzzing of every POST route's JSON over a real HTTP server (the fake
engine): whatever the body (fields of the wrong type or range, unknown fields, deep nesting,
huge or overflowing numbers, odd strings), the answer is a 4xx or a 200, never a 5xx or a
hang, no body names an internal exception, and a valid request afterwards still returns the
same greedy text."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

USER = [{"role": "user", "content": "Hi"}]
ROUTES = {
    "/generate": {"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
    "/generate_stream": {"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
    "/": {"inputs": "Hi", "parameters": {"max_new_tokens": 3}, "stream": False},
    "/v1/chat/completions": {"messages": USER, "max_tokens": 3},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 3},
    "/tokenize": {"inputs": "Hi"},
    "/chat_tokenize": {"messages": USER},
    "/invocations": {"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
}
FIELDS = [
    "inputs", "parameters", "max_new_tokens", "temperature", "top_p", "top_k", "stop",
    "seed", "best_of", "grammar", "messages", "tools", "tool_choice", "response_format",
    "stream", "stream_options", "logprobs", "top_logprobs", "n", "prompt", "echo",
    "max_tokens", "repetition_penalty", "frequency_penalty", "truncate", "details",
    "decoder_input_details", "top_n_tokens", "content", "role", "function", "parameters",
    "$defs", "definitions", "type", "value", "json_schema", "schema", "properties",
]  # fmt: skip
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_NUMBERS = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
_NUMBERS |= st.sampled_from([0, -1, 1e-45, 1e38, 3.5e38, 2**64, 0.5, 1.0])
_VALUES = st.recursive(
    st.none() | st.booleans() | _NUMBERS | _TEXT | st.sampled_from(FIELDS),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | _TEXT, inner, max_size=4)
    ),
    max_leaves=20,
)
_PATHS = st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)
_INTERNAL = re.compile(r"Traceback|Error\(|Exception|KeyError|TypeError|AttributeError")


def _mutate(body: dict, path: list[str], value) -> dict:
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value
    return body


def _post(client: httpx.Client, route: str, text: str) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return client.post(route, content=text.encode("utf-8", "surrogatepass"), headers=headers)


def _answer(text: str):
    """A response without what differs between two identical requests (OpenAI ids, times)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text  # SSE: the fake engine's events carry no ids or times
    if isinstance(value, dict) and "choices" in value:
        return value["choices"], value["usage"]
    return value


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert not _INTERNAL.search(r.text), r.text[:300]


@pytest.fixture(scope="module")
def baseline(live_server):
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        return {
            route: _answer(client.post(route, json=body).text) for route, body in ROUTES.items()
        }


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(sorted(ROUTES)), path=_PATHS, value=_VALUES)
def test_no_body_reaches_a_5xx(live_server, route, path, value):
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        _check(_post(client, route, json.dumps(_mutate(ROUTES[route], path, value))))


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_hostile_shapes(live_server, baseline, route):
    """Deep nesting with a lone surrogate (500s on all eight routes before), numbers that
    overflow, underflowing temperatures, tools nested hundreds of levels, wrong `$defs`."""
    deep = "[" * 400 + '"\\ud800"' + "]" * 400
    nested_schema = {"type": "object"}
    for _ in range(300):
        nested_schema = {"type": "object", "properties": {"a": nested_schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": nested_schema}}
    texts = [
        json.dumps(ROUTES[route])[:-1] + f', "x": {deep}}}',
        json.dumps(ROUTES[route]).replace("3", "1e999"),
        json.dumps(ROUTES[route]).replace("3", "-1e999"),
        json.dumps(_mutate(ROUTES[route], ["temperature"], 1e-45)),
        json.dumps(_mutate(ROUTES[route], ["parameters", "temperature"], 1e39)),
        json.dumps(_mutate(ROUTES[route], ["tools"], [tool])),
        json.dumps(
            _mutate(
                ROUTES[route],
                ["tools"],
                [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"$defs": [1], "definitions": "x"}},
                    }
                ],
            )
        ),  # fmt: skip
        json.dumps(_mutate(ROUTES[route], ["stop"], ["y" * 100_000])),
    ]
    with httpx.Client(base_url=live_server.url, timeout=10) as client:
        for text in texts:
            _check(_post(client, route, text))
        # the server still answers a valid request exactly as before
        assert _answer(client.post(route, json=ROUTES[route]).text) == baseline[route]
