"""The default model (SmolLM2-135M-Instruct) under grammars, with its real 49k byte-level
vocabulary: greedy decoding through the token masks always ends with EOS in an accepting
state, and the JSON parses and validates with jsonschema."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from tests.paged import PagedDriver
from tgix.grammar import GrammarCompiler, GrammarSpec
from tgix.models import load_model
from tgix.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"type": "string"},
        "population": {"type": "integer", "minimum": 0},
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "country", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def default():
    loaded = load_model()
    tokenizer = load_tokenizer(loaded.files)
    driver = PagedDriver(
        loaded.model, loaded.config, loaded.mesh, page_size=16, num_pages=40, pages_per_row=24
    )
    compiler = GrammarCompiler.for_tokenizer(tokenizer, size=loaded.config.vocab_size, workers=0)
    return driver, tokenizer, compiler


def constrained_greedy(driver, index, prompt, max_new_tokens):
    """argmax over the allowed tokens each step (the engine's mask, applied on the host)."""
    assert len(prompt) <= 256
    state, out = index.start, []
    logits = driver.step({"g": prompt}, num_tokens=256)["g"]  # the chat prompt: ~170 tokens
    for _ in range(max_new_tokens):
        bits = np.unpackbits(index.mask(state).view(np.uint8), bitorder="little")
        token = int(np.argmax(np.where(bits[: len(logits)] == 1, logits, -np.inf)))
        out.append(token)
        state = index.advance(state, token)
        if token in index.eos_ids:
            break
        logits = driver.step({"g": [token]})["g"]
    driver.release("g")
    return out


def chat(tokenizer, text):
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def test_json_schema_output_validates(default):
    driver, tokenizer, compiler = default
    index = compiler.compile(GrammarSpec.json(CITY))
    ids = constrained_greedy(driver, index, chat(tokenizer, "Describe Paris as JSON."), 80)
    assert ids[-1] in index.eos_ids, tokenizer.decode(ids)
    value = json.loads(tokenizer.decode(ids[:-1]))
    jsonschema.validate(value, CITY)


def test_regex_output_matches(default):
    driver, tokenizer, compiler = default
    pattern = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    index = compiler.compile(GrammarSpec.regex(pattern))
    prompt = chat(tokenizer, "On what date did the Berlin wall fall? Answer YYYY-MM-DD.")
    ids = constrained_greedy(driver, index, prompt, 20)
    assert ids[-1] in index.eos_ids
    assert re.fullmatch(pattern, tokenizer.decode(ids[:-1]))
