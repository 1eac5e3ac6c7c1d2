"""fp8 KV cache (`--kv-cache-dtype fp8_e4m3fn | fp8_e5m2`): stores saturate instead of turning
into NaN; pages in fp8 keep the model's greedy tokens and logits close to float32 pages; a
checkpoint's per-layer k_scale/v_scale are applied (keys beyond e4m3's range survive with
them, are clipped without them); the engine's KV budget counts the smaller pages."""

import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.paged import PagedDriver, greedy
from tgix.attention.contract import read_pages, storage_dtype, store_kv, write_kv
from tgix.models import CheckpointError, load_model

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2


def test_stores_saturate_instead_of_overflowing_to_nan():
    """fp8 pages are bytes (uint8 for e4m3fn, int8 for e5m2); a store clips, then casts."""
    x = jnp.array([500.0, -1000.0, 300.0, 1e-4, 0.0, 60000.0])
    assert storage_dtype(E4M3) == jnp.uint8 and storage_dtype(E5M2) == jnp.int8
    assert storage_dtype(jnp.bfloat16) == jnp.bfloat16
    e4m3 = np.asarray(read_pages(store_kv(x, storage_dtype(E4M3)), slice(None)))
    np.testing.assert_array_equal(e4m3, [448, -448, 288, 0, 0, 448])
    assert np.isnan(np.asarray(x.astype(E4M3).astype(jnp.float32))[0])  # why the clip is there
    e5m2 = np.asarray(read_pages(store_kv(x, storage_dtype(E5M2)), slice(None)))
    assert np.isfinite(e5m2).all() and e5m2[-1] == 57344
    for rows in (1, 2):  # the one-token update and the scatter
        pages = jnp.zeros((3, 2, 1, 2), storage_dtype(E4M3))
        new = jnp.stack([jnp.full((1, 2), 1e6), jnp.full((1, 2), -0.5)])[:rows]
        written = read_pages(write_kv(pages, new, jnp.array([3, 4])[:rows]), slice(None))
        assert float(written[1, 1, 0, 0]) == 448.0 and not np.isnan(np.asarray(written)).any()
        assert rows == 1 or float(written[2, 0, 0, 1]) == -0.5


def logits_of(loaded, prompt, kv_dtype=None):
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=16, kv_dtype=kv_dtype)
    out = [driver.step({"r": prompt}, num_tokens=16, all_logits=True)["r"]]
    for _ in range(3):
        out.append(driver.step({"r": [int(np.argmax(out[-1][-1]))]})["r"][None])
    driver.release("r")
    assert len(driver.free) == 15
    return np.concatenate(out)


def test_e4m3_pages_keep_float_pages_greedy_tokens(tiny_checkpoints):
    """e4m3 (3 mantissa bits) keeps 12 greedy tokens of 3 prompts; e5m2 (2 bits) moved one
    of them after 5 tokens on this random model, so it is held to its logits below."""
    loaded = load_model(str(tiny_checkpoints("llama")))
    drivers = [
        PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=24, kv_dtype=dtype)
        for dtype in (None, E4M3)
    ]
    for n in (7, 12, 15):
        prompt = list(range(5, 5 + n))
        want = greedy(drivers[0], prompt, 12, bucket=16)
        assert greedy(drivers[1], prompt, 12, bucket=16) == want


@pytest.mark.parametrize("kv_dtype", [E4M3, E5M2], ids=["e4m3fn", "e5m2"])
def test_fp8_pages_give_logits_close_to_float_pages(tiny_checkpoints, kv_dtype):
    """The prompt attends to its own K/V (float); the decode steps read fp8 pages."""
    loaded = load_model(str(tiny_checkpoints("llama")))
    prompt = list(range(5, 17))
    full, fp8 = logits_of(loaded, prompt), logits_of(loaded, prompt, kv_dtype)
    np.testing.assert_allclose(fp8[:12], full[:12], atol=1e-4, rtol=0)  # the prompt: own K/V
    difference = np.abs(fp8[12:] - full[12:]).max()
    assert 0 < difference < (0.05 if kv_dtype == E4M3 else 0.1) * np.abs(full).max()


@pytest.fixture(scope="module")
def loud_keys(tiny_checkpoints, tmp_path_factory):
    """The tiny checkpoint with keys 300x larger (beyond e4m3's 448) and queries 300x smaller
    (so the model computes the same scores), plus k_scale 300 and v_scale 0.5 per layer."""
    dst = shutil.copytree(tiny_checkpoints("llama"), tmp_path_factory.mktemp("loud") / "m")
    scaled = shutil.copytree(dst, dst.parent / "scaled")
    tensors = load_file(dst / "model.safetensors")
    for name in list(tensors):
        if name.endswith("k_proj.weight"):
            tensors[name] = tensors[name] * 300
        elif name.endswith("q_proj.weight"):
            tensors[name] = tensors[name] / 300
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    for layer in range(3):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = np.array(300.0, np.float32)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = np.array([0.5], np.float32)
    save_file(tensors, scaled / "model.safetensors", metadata={"format": "pt"})
    return str(dst), str(scaled)


def test_checkpoint_kv_scales_keep_large_keys_in_range(loud_keys):
    plain, scaled = (load_model(path) for path in loud_keys)
    assert scaled.model.layers[2].self_attn.kv_scales == (300.0, 0.5)
    assert plain.model.layers[2].self_attn.kv_scales == (1.0, 1.0)
    prompt = list(range(9, 21))
    want = logits_of(plain, prompt)  # float pages: scales play no part
    np.testing.assert_allclose(logits_of(scaled, prompt), want, atol=1e-3, rtol=0)
    with_scales = np.abs(logits_of(scaled, prompt, E4M3)[12:] - want[12:]).max()
    clipped = np.abs(logits_of(plain, prompt, E4M3)[12:] - want[12:]).max()
    assert with_scales < 0.05 * np.abs(want).max() < clipped


def test_a_bad_kv_scale_is_refused_by_name(loud_keys, tmp_path):
    bad = shutil.copytree(loud_keys[1], tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    tensors["model.layers.1.self_attn.k_scale"] = np.array(-1.0, np.float32)
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="model.layers.1.self_attn.k_scale must be one"):
        load_model(str(bad))


def test_the_engine_budget_counts_fp8_pages(tiny_checkpoints):
    """The KV budget is the same bytes in fp8 pages: 4x the float32 tokens (1 byte of K and
    of V per element instead of 4), and the engine serves from them."""
    from tests.engine.conftest import LIMITS
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.kv_cache import kv_bytes_per_token
    from tgix.engine.limits import LimitRequest, cpu_kv_bytes, kv_budget_tokens

    limits = dict(LIMITS, max_batch_total_tokens=None, max_batch_size=None)
    share = 1000 * 768 / cpu_kv_bytes()  # a share of RAM that holds about 1000 float tokens
    options = EngineOptions(
        progress=False, kv_dtype="float8_e4m3fn", host_memory_share=share, compile=False
    )
    path = str(tiny_checkpoints("llama"))
    with LLM(path, limits=LimitRequest(**limits), options=options) as llm:
        model_cfg = load_model(path).config
        per_token = kv_bytes_per_token(model_cfg, E4M3)
        assert per_token * 4 == kv_bytes_per_token(model_cfg, jnp.float32)
        free = int(cpu_kv_bytes() * share)
        want = kv_budget_tokens(free_bytes=free, kv_bytes_per_token=per_token, on_cpu=True)
        assert llm.engine.limits.max_batch_total_tokens == want > 3000
        assert llm.engine.kv_dtype == "float8_e4m3fn"
        [done] = llm.generate([list(range(5, 17))], max_new_tokens=6, ignore_eos=True)
        assert len(done.tokens) == 6
