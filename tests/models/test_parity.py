"""tgix logits vs transformers (PyTorch, float32) on the same tiny random weights, per family.

Every step runs through the paged cache with page_size 4, so sequences cross pages; steps are
padded to one bucket (32 tokens, 2 rows) so padding is exercised too.
"""

import numpy as np
import pytest
import torch

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import load_model

pytestmark = pytest.mark.reference
ATOL = 1e-4
BUCKET = {"num_tokens": 32, "num_rows": 2}


@pytest.fixture(
    scope="module",
    params=[(f, "paged") for f in testing.FAMILIES] + [("mistral", "reference")],
    ids=lambda p: "-".join(p),
)
def pair(request, tiny_checkpoints):
    """(family, tgix PagedDriver, transformers model) on one checkpoint; every family through
    the default (paged) attention, one through the reference oracle too."""
    family, attention = request.param
    path = tiny_checkpoints(family)
    loaded = load_model(str(path), attention=attention)
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=4, num_pages=40)
    yield family, driver, testing.load_reference_model(path)
    assert len(driver.free) == 39, "every test must release its pages"


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 290, size=n).tolist()


def reference_logits(model, token_ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].numpy()


def test_full_sequence_forward(pair):
    family, driver, ref = pair
    prompt = ids(1, 21)  # longer than mistral's window (5) and dynamic/yarn's 16
    ours = driver.step({"r": prompt}, all_logits=True, **BUCKET)["r"]
    driver.release("r")
    expected = reference_logits(ref, prompt)
    assert expected.std() > 0.5, "weights too small for a meaningful comparison"
    np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0, err_msg=family)


def test_prefill_then_decode_through_pages(pair):
    family, driver, ref = pair
    prompt, continuation = ids(2, 11), ids(3, 7)
    with torch.no_grad():
        out = ref(torch.tensor([prompt]), use_cache=True)
    ours = driver.step({"r": prompt}, **BUCKET)["r"]
    np.testing.assert_allclose(ours, out.logits[0, -1].numpy(), atol=ATOL, rtol=0, err_msg=family)
    cache = out.past_key_values
    for step, token in enumerate(continuation):  # teacher-forced, so both see the same ids
        with torch.no_grad():
            out = ref(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = out.past_key_values
        ours = driver.step({"r": [token]}, **BUCKET)["r"]
        np.testing.assert_allclose(
            ours,
            out.logits[0, -1].numpy(),
            atol=ATOL,
            rtol=0,
            err_msg=f"{family} decode step {step}",
        )
    driver.release("r")


def test_two_requests_of_different_lengths_in_one_step(pair):
    family, driver, ref = pair
    a, b = ids(4, 9), ids(5, 14)
    ours = driver.step({"a": a, "b": b}, all_logits=True, **BUCKET)
    np.testing.assert_allclose(ours["a"], reference_logits(ref, a), atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours["b"], reference_logits(ref, b), atol=ATOL, rtol=0)
    # then one decode token each, packed again: each row must see only its own history
    ta, tb = ids(6, 1)[0], ids(7, 1)[0]
    ours = driver.step({"a": [ta], "b": [tb]}, **BUCKET)
    np.testing.assert_allclose(
        ours["a"], reference_logits(ref, [*a, ta])[-1], atol=ATOL, rtol=0, err_msg=family
    )
    np.testing.assert_allclose(
        ours["b"], reference_logits(ref, [*b, tb])[-1], atol=ATOL, rtol=0, err_msg=family
    )
    driver.release("a")
    driver.release("b")
