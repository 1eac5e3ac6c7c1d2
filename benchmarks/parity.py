"""Max |logit difference| between tgix and transformers per family (float32, CPU).

    python -m benchmarks.parity

Same three checks as tests/models/test_parity.py (full forward of 21 tokens; prefill 11 then
7 cached decode steps; two requests of 9 and 14 tokens packed in one step), printed as a table.
"""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import torch

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import load_model


def ids(seed, n):
    return np.random.default_rng(seed).integers(3, 290, size=n).tolist()


def ref_logits(model, token_ids):
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].numpy()


def family_errors(family, folder):
    path = testing.write_tiny_checkpoint(family, folder)
    loaded = load_model(str(path))
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=4, num_pages=40)
    bucket = {"num_tokens": 32, "num_rows": 2}
    full_ref = testing.load_reference_model(path)
    prompt = ids(1, 21)
    ours = driver.step({"r": prompt}, all_logits=True, **bucket)["r"]
    full = np.abs(ours - ref_logits(full_ref, prompt)).max()
    driver.release("r")

    ref = testing.load_reference_model(path)  # fresh: dynamic rope keeps state between calls
    prompt, decode = ids(2, 11), 0.0
    with torch.no_grad():
        out = ref(torch.tensor([prompt]), use_cache=True)
    decode = np.abs(driver.step({"r": prompt}, **bucket)["r"] - out.logits[0, -1].numpy()).max()
    for token in ids(3, 7):
        with torch.no_grad():
            out = ref(torch.tensor([[token]]), cache=out.past_key_values, use_cache=True)
        step = driver.step({"r": [token]}, **bucket)["r"]
        decode = max(decode, np.abs(step - out.logits[0, -1].numpy()).max())
    driver.release("r")

    a, b = ids(4, 9), ids(5, 14)
    ours = driver.step({"a": a, "b": b}, all_logits=True, **bucket)
    packed = max(
        np.abs(ours["a"] - ref_logits(full_ref, a)).max(),
        np.abs(ours["b"] - ref_logits(full_ref, b)).max(),
    )
    scale = np.abs(ref_logits(full_ref, a)).max()
    return full, decode, packed, scale


def main():
    print("| family | full forward (21) | prefill 11 + 7 decode | 2 packed rows | max |logit| |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for family in testing.FAMILIES:
            full, decode, packed, scale = family_errors(family, os.path.join(tmp, family))
            print(f"| {family} | {full:.2e} | {decode:.2e} | {packed:.2e} | {scale:.1f} |")


if __name__ == "__main__":
    main()
