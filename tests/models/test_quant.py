"""Load-time quantization (--quantize eetq | bitsandbytes | fp8): codes and scales are what the
per-channel definition says (computed here independently); weight-only, the quantized model's
logits equal transformers' on a checkpoint holding those dequantized weights (1e-4), at every
row count the CPU lowering distinguishes (1 row, a few rows, a prefill), on 1, 2 and 4 shards;
with int8 activations (CPU's default for int8 codes) each product equals its integer
definition, a row's result does not depend on the rest of the step, and the default model
keeps float32's greedy tokens."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from tests.paged import PagedDriver
from tgix import testing
from tgix.models import load_model
from tgix.models.cpu_int8 import packed_shape
from tgix.models.quant import (
    CPU_REDUCE_MAX_ROWS,
    default_int8_activations,
    default_native,
    dequantize,
    qmatmul,
    quantize_rows,
)
from tgix.sharding import make_mesh
from tgix.testing_quant import write_roundtrip_twin

pytestmark = pytest.mark.reference
ATOL = 1e-4
ATOL_ROUNDED = 1e-3  # activations as two int8 digits (XLA's int8 dot, the native kernel)


def test_int8_codes_are_rounded_weights_over_the_channel_absmax():
    w = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)  # [N, K]
    w[2] = 0.0  # an all-zero output channel
    codes, scale = quantize_rows(w, "eetq")
    absmax = np.abs(w).max(axis=1)
    want_scale = np.where(absmax > 0, absmax / 127, 1).astype(np.float32)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(codes, np.rint(w / want_scale[:, None]).astype(np.int8))
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127 and not codes[2].any()
    err = np.abs(dequantize(codes, scale) - w)
    assert (err <= want_scale[:, None] / 2 + 1e-7).all()
    assert quantize_rows(w, "bitsandbytes")[0].tobytes() == codes.tobytes()


def test_fp8_codes_saturate_instead_of_overflowing_to_nan():
    w = np.array([[500.0, -1000.0, 1.0, 0.0]], np.float32)
    codes, scale = quantize_rows(w, "fp8")
    assert codes.dtype == ml_dtypes.float8_e4m3fn
    assert scale[0] == np.float32(1000.0 / 448)
    values = codes.astype(np.float32)
    assert np.isfinite(values).all() and values[0, 1] == -448.0
    np.testing.assert_allclose(dequantize(codes, scale), w, rtol=0.07, atol=1e-3)


@pytest.fixture(scope="module", params=[("llama", "eetq"), ("qwen2", "fp8")], ids="-".join)
def quantized(request, tiny_checkpoints, tmp_path_factory):
    family, method = request.param
    src = tiny_checkpoints(family)
    roundtrip = lambda w: dequantize(*quantize_rows(w, method))
    head = None  # on tgix's int8 CPU kernel the head is read as bfloat16 (decoder.logits)
    if default_native(method):
        head = lambda w: np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32)
    twin = tmp_path_factory.mktemp("deq") / family
    ref_path = write_roundtrip_twin(src, twin, roundtrip, head)
    return str(src), method, testing.load_reference_model(ref_path)


def ids(seed, n):
    return np.random.default_rng(seed).integers(3, 290, size=n).tolist()


def test_logits_match_transformers_on_the_dequantized_weights(quantized):
    path, method, ref = quantized
    loaded = load_model(path, quantize=method, int8_activations=False)
    assert loaded.quantize == method
    layer = loaded.model.layers[0]
    native = default_native(method)  # eetq on CPU: tgix's kernel, and the head as bfloat16
    up = layer.mlp.up_proj
    assert up.kernel is None and up.native_int8 == native
    if native:  # packed as the kernel reads them: [N/16, K/4, 64] (cpu_int8.pack)
        assert up.codes[...].dtype == jnp.uint8 and up.codes[...].shape == packed_shape(56, 40)
    else:
        assert up.codes[...].shape == (56, 40)
    assert (loaded.model.head_bf16 is not None) == native
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, page_size=4, num_pages=40)
    prompt, continuation = ids(1, 19), ids(2, 5)
    with torch.no_grad():
        full = ref(torch.tensor([prompt + continuation])).logits[0].numpy()
    assert full.std() > 0.5
    atol = ATOL_ROUNDED if native else ATOL  # int8_activations=False: weight-only in XLA
    # a prefill bucket (dot form), then one-row decode steps, then a step of a few rows
    ours = driver.step({"r": prompt}, num_tokens=32, all_logits=True)["r"]
    np.testing.assert_allclose(ours, full[: len(prompt)], atol=atol, rtol=0)
    for j, token in enumerate(continuation[:3]):
        ours = driver.step({"r": [token]})["r"]
        np.testing.assert_allclose(ours, full[len(prompt) + j], atol=atol, rtol=0)
    few = continuation[3:]
    assert len(few) + 2 <= CPU_REDUCE_MAX_ROWS
    ours = driver.step({"r": few, "s": prompt[:2]}, num_tokens=4, all_logits=True)
    np.testing.assert_allclose(ours["r"], full[len(prompt) + 3 :], atol=atol, rtol=0)
    np.testing.assert_allclose(ours["s"], full[:2], atol=atol, rtol=0)
    driver.release("r")
    driver.release("s")
    assert len(driver.free) == 39


@pytest.mark.parametrize("shards", [2, 4])
@pytest.mark.parametrize("int8_activations", [False, None], ids=["weight-only", "default"])
def test_each_shard_holds_its_slice_of_the_same_codes(quantized, shards, int8_activations):
    """Weight-only, shards give 1 device's logits (1e-4). With int8 activations a float
    difference of 1e-7 upstream can move a rounding of the activations' low digit (1/64,000
    of the row's largest value), so logits agree to 1e-3 and their argmax exactly."""
    path, method, _ = quantized
    one = load_model(  # XLA's forms on one device too (the native kernel: test_cpu_int8)
        path,
        quantize=method,
        mesh=make_mesh(model=1),
        int8_activations=int8_activations,
        native_int8=False,
    )
    many = load_model(
        path, quantize=method, mesh=make_mesh(model=shards), int8_activations=int8_activations
    )
    rounded = one.model.layers[0].mlp.up_proj.int8_activations
    assert rounded == (int8_activations is None and default_int8_activations(method))
    assert not one.model.layers[0].mlp.up_proj.native_int8 and one.model.head_bf16 is None
    assert not many.model.layers[0].mlp.up_proj.native_int8  # GSPMD cannot split it
    proj = many.model.layers[0].mlp.down_proj  # codes [D, F]: sharded along F (contracted)
    assert proj.codes[...].sharding.spec[1] == "model"
    np.testing.assert_array_equal(
        np.asarray(proj.codes[...]).astype(np.float32),
        np.asarray(one.model.layers[0].mlp.down_proj.codes[...]).astype(np.float32),
    )
    prompt = ids(3, 13)
    logits = []
    for loaded in (one, many):
        driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=16)
        step = [driver.step({"r": prompt}, num_tokens=16)["r"]]
        step.append(driver.step({"r": [int(np.argmax(step[0]))]})["r"])
        driver.release("r")
        assert len(driver.free) == 15
        logits.append(np.stack(step))
    np.testing.assert_allclose(logits[1], logits[0], atol=ATOL_ROUNDED if rounded else ATOL, rtol=0)
    np.testing.assert_array_equal(logits[1].argmax(-1), logits[0].argmax(-1))


def test_int8_activation_products_are_their_integer_definition():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((24, 40)).astype(np.float32)  # [N, K]
    codes, scale = quantize_rows(w, "eetq")
    for t in (1, 3, 16):
        x = rng.standard_normal((t, 40)).astype(np.float32)
        x[0] = 0.0  # a padding row
        sx = np.abs(x).max(axis=1, keepdims=True) / 127
        sx[sx == 0] = 1
        high = np.rint(x / sx)
        low = np.rint((x / sx - high) * 254)
        assert np.abs(low).max() <= 127
        c = codes.T.astype(np.int64)
        acc_high, acc_low = high.astype(np.int64) @ c, low.astype(np.int64) @ c
        want = (acc_high + acc_low / 254) * sx * scale[None, :]
        # two int8 digits: as close to the float product as the weights alone allow
        exact = x @ dequantize(codes, scale).T
        np.testing.assert_allclose(want, exact, atol=2e-4 * np.abs(exact).max())
        got = np.asarray(qmatmul(jnp.asarray(x), jnp.asarray(codes), jnp.asarray(scale),
                                 int8_activations=True))  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert not got[0].any()


def test_a_rows_product_does_not_depend_on_the_rest_of_the_step():
    """int8 activations: integer sums are exact, so a row's product is bit-equal alone and
    beside other rows, whatever the row count."""
    rng = np.random.default_rng(5)
    codes, scale = (jnp.asarray(a) for a in quantize_rows(rng.standard_normal((64, 96)), "eetq"))
    row = rng.standard_normal((1, 96)).astype(np.float32)
    alone = np.asarray(qmatmul(jnp.asarray(row), codes, scale, int8_activations=True))
    for t in (2, 5, 16, 64):
        x = rng.standard_normal((t, 96)).astype(np.float32)
        x[t // 2] = row[0]
        got = np.asarray(qmatmul(jnp.asarray(x), codes, scale, int8_activations=True))
        np.testing.assert_array_equal(got[t // 2], alone[0])


@pytest.mark.slow
def test_default_model_keeps_float32s_greedy_tokens():
    """The quality gate of --quantize eetq on the default model: 32 greedy tokens equal
    float32's for at least 3 of 4 prompts (measured: BENCHMARKS.md)."""
    from tests.models.test_default_model import NEW_TOKENS, prompts
    from tests.paged import greedy
    from tgix.tokenizer import load_tokenizer

    answers = {}
    for method in (None, "eetq"):
        loaded = load_model(quantize=method)
        tokenizer = load_tokenizer(loaded.files)
        driver = PagedDriver(
            loaded.model, loaded.config, loaded.mesh, page_size=16, num_pages=16, pages_per_row=8
        )
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Name three primary colors."}]
        )
        cases = [*prompts(tokenizer), tokenizer.encode(chat)]
        answers[method] = [greedy(driver, p, NEW_TOKENS, bucket=64) for p in cases]
        assert len(driver.free) == 15
    same = [a == b for a, b in zip(answers[None], answers["eetq"], strict=True)]
    assert sum(same) >= 3, same
