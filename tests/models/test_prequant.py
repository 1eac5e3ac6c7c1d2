"""Pre-quantized checkpoints (AWQ, GPTQ v1/v2/act-order, compressed-tensors int and fp8): the
unpacked weights are bit-equal to each format's definition (the writers in tgix.testing_quant
compute it from the codes before packing), the model's logits equal transformers' on those
dequantized weights (1e-4) in the kept and float forms, greedy ids equal, 3 shards give one
device's logits, and contradictory flags are refused naming both values."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from tests.paged import PagedDriver, greedy, prompt_then_tokens
from tgix import testing, testing_quant
from tgix.models import QuantizeError, cpu_int8, load_model
from tgix.models.checkpoint import SafetensorsSource
from tgix.models.prequant import PrequantizedSource, check_flag, read_spec
from tgix.models.quant_group import GroupedWeight
from tgix.sharding import make_mesh

pytestmark = pytest.mark.reference
ATOL = 1e-4
# 6 query heads, 3 KV heads, widths of 48: every layer splits over 3 shards on group bounds
SHAPE = {
    "hidden_size": 48, "intermediate_size": 48, "num_attention_heads": 6,
    "num_key_value_heads": 3, "head_dim": 8,
}  # fmt: skip
VARIANTS = {
    "awq": (testing_quant.write_awq_checkpoint, {"skip": ("model.layers.0.mlp.down_proj",)}),
    "gptq-v1": (testing_quant.write_gptq_checkpoint, {}),
    "gptq-v2": (testing_quant.write_gptq_checkpoint, {"version": "v2"}),
    "gptq-act-order": (testing_quant.write_gptq_checkpoint, {"act_order": True, "sym": False}),
    "gptq-8bit": (testing_quant.write_gptq_checkpoint, {"bits": 8}),
    "ct-int4": (testing_quant.write_compressed_tensors_checkpoint, {}),
    "ct-int4-asym": (testing_quant.write_compressed_tensors_checkpoint, {"sym": False}),
    "ct-int8-channel": (
        testing_quant.write_compressed_tensors_checkpoint,
        {"bits": 8, "group": None},
    ),  # fmt: skip
    "ct-fp8": (testing_quant.write_compressed_tensors_checkpoint, {"fp8": True}),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("float")
    return testing.write_tiny_checkpoint("llama", path, seed=3, overrides=SHAPE)


@pytest.fixture(scope="module")
def checkpoints(base, tmp_path_factory):
    """variant -> (quantized folder, float reference folder), written once on demand."""
    cache = {}

    def get(variant):
        if variant not in cache:
            writer, kwargs = VARIANTS[variant]
            root = tmp_path_factory.mktemp(variant)
            writer(base, root / "q", reference=root / "ref", **kwargs)
            cache[variant] = root / "q", root / "ref"
        return cache[variant]

    return get


def source_of(path, *, kept):
    config = json.loads((path / "config.json").read_text())
    return PrequantizedSource(SafetensorsSource(path), read_spec(config, path), kept=kept)


def quantized_reads_equal(source, ref_path) -> int:
    """Every tensor `source` shows equals the float reference's bit for bit (a kept layer's
    dequantization, its layout the one announced before reading); how many were kept."""
    want = load_file(ref_path / "model.safetensors")
    assert sorted(source.names()) == sorted(want)
    quantized = 0
    for name in want:
        got = source.read(name)
        if isinstance(got, GroupedWeight):
            quantized += 1
            assert source.layout(name) == got.layout
            got = got.dequantize()
        assert got.dtype == want[name].dtype and got.shape == want[name].shape, name
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    return quantized


@pytest.mark.parametrize("variant", VARIANTS)
def test_unpacked_weights_equal_the_format_definition(checkpoints, variant):
    path, ref_path = checkpoints(variant)
    for kept in (False, True):
        quantized = quantized_reads_equal(source_of(path, kept=kept), ref_path)
        layers = 3 * 7 - (variant == "awq")  # AWQ's skipped down_proj stays float
        assert quantized == (layers if kept else 0)


def test_act_order_moves_groups_into_one_block_each(checkpoints):
    path, _ = checkpoints("gptq-act-order")
    weight = source_of(path, kept=True).read_grouped("model.layers.1.mlp.up_proj")
    assert weight.perm is not None and weight.layout.perm
    assert not np.array_equal(weight.perm, np.arange(48))
    g_idx = load_file(path / "model.safetensors")["model.layers.1.mlp.up_proj.g_idx"]
    np.testing.assert_array_equal(g_idx[weight.perm], np.arange(48) // 8)


def test_v2_zeros_under_a_gptq_label_are_recognised_by_value(checkpoints, tmp_path):
    """GPTQModel writes true (v2) zeros under checkpoint_format "gptq"; symmetric 4-bit zeros
    of 8 everywhere can only be v2 (v1 stores 7), so they are not shifted by one scale."""
    path, ref_path = checkpoints("gptq-v2")
    relabelled = shutil.copytree(path, tmp_path / "q")
    config = json.loads((relabelled / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq"
    (relabelled / "config.json").write_text(json.dumps(config))
    name = "model.layers.2.self_attn.k_proj.weight"
    np.testing.assert_array_equal(
        source_of(relabelled, kept=False).read(name),
        load_file(ref_path / "model.safetensors")[name],
    )


def ids(seed, n):
    return np.random.default_rng(seed).integers(3, 290, size=n).tolist()


@pytest.mark.parametrize(
    "variant,form",
    [(v, "kept") for v in VARIANTS]
    + [("awq", "float"), ("gptq-act-order", "float"), ("ct-fp8", "float")],
)
def test_logits_match_transformers_on_the_dequantized_weights(checkpoints, variant, form):
    path, ref_path = checkpoints(variant)
    loaded = load_model(str(path), quantize_form=form)
    method = (
        "gptq"
        if variant.startswith("gptq")
        else "awq"
        if variant == "awq"
        else "compressed-tensors"
    )
    assert (loaded.quantize, loaded.quantize_form) == (method, form)
    proj = loaded.model.layers[1].mlp.gate_proj
    is_float = proj.kernel is not None or proj.weight is not None  # [K, N] or out-major [N, K]
    assert (not is_float) == (form == "kept")
    if form == "kept" and variant in ("awq", "gptq-v1", "ct-int4"):
        assert proj.codes[...].shape == (48, 24)  # two 4-bit codes per byte
    prompt, continuation = ids(1, 17), ids(2, 3)
    with torch.no_grad():
        ref = testing.load_reference_model(ref_path)
        full = ref(torch.tensor([prompt + continuation])).logits[0].numpy()
    assert full.std() > 0.5
    np.testing.assert_allclose(
        prompt_then_tokens(loaded, prompt, continuation), full, atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("variant", ["awq", "gptq-act-order"])
def test_greedy_ids_equal_transformers_generate(checkpoints, variant):
    path, ref_path = checkpoints(variant)
    loaded = load_model(str(path), quantize_form="kept")
    driver = PagedDriver(loaded.model, loaded.config, loaded.mesh, num_pages=24)
    prompt = ids(5, 9)
    ref = testing.load_reference_model(ref_path)
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert greedy(driver, prompt, 12, bucket=16) == want[0, len(prompt) :].tolist()
    assert len(driver.free) == 23


@pytest.mark.parametrize("variant", ["awq", "gptq-act-order"])
def test_three_shards_give_one_devices_logits(checkpoints, variant):
    path, _ = checkpoints(variant)
    one = load_model(str(path), quantize_form="kept", mesh=make_mesh(model=1))
    three = load_model(str(path), quantize_form="kept", mesh=make_mesh(model=3))
    down = three.model.layers[1].mlp.down_proj  # codes [D, F / 2]: split along F (contracted)
    assert (
        down.codes[...].sharding.spec[1] == "model" and down.scale[...].sharding.spec[1] == "model"
    )
    np.testing.assert_array_equal(
        np.asarray(down.codes[...]), np.asarray(one.model.layers[1].mlp.down_proj.codes[...])
    )
    prompt, continuation = ids(3, 11), ids(4, 2)
    want = prompt_then_tokens(one, prompt, continuation)
    np.testing.assert_allclose(
        prompt_then_tokens(three, prompt, continuation), want, atol=ATOL, rtol=0
    )


def test_int8_form_requantizes_per_output_channel(checkpoints):
    """The opt-in CPU fast form: 4-bit weights re-quantized to int8 rows (quant.py), so
    logits move by the int8 rounding only."""
    path, ref_path = checkpoints("gptq-v1")
    loaded = load_model(str(path), quantize_form="int8")
    proj = loaded.model.layers[0].self_attn.q_proj
    assert proj.scale[...].shape == (48,)
    codes = proj.codes[...]  # int8 [N, K], or packed for tgix's CPU kernel (cpu_int8.pack)
    native = proj.native_int8
    assert codes.shape == (cpu_int8.packed_shape(48, 48) if native else (48, 48))
    assert codes.dtype == (np.uint8 if native else np.int8)
    prompt = ids(6, 12)
    with torch.no_grad():
        full = testing.load_reference_model(ref_path)(torch.tensor([prompt])).logits[0].numpy()
    got = prompt_then_tokens(loaded, prompt, [])
    assert np.abs(got - full).max() < 0.1 * full.std()  # measured 0.07
    assert (got.argmax(-1) == full.argmax(-1)).sum() >= 10  # of 12; measured 11


def test_flags_that_contradict_the_checkpoint_are_refused_naming_both(checkpoints, base):
    path, _ = checkpoints("gptq-v1")
    with pytest.raises(QuantizeError, match=r"`--quantize eetq` contradicts .* `gptq`"):
        load_model(str(path), quantize="eetq")
    with pytest.raises(QuantizeError, match=r"`--quantize awq` reads a pre-quantized"):
        load_model(str(base), quantize="awq")
    with pytest.raises(QuantizeError, match=r"`--quantize exl2` reads a pre-quantized"):
        load_model(str(base), quantize="exl2")
    gptq, awq = (
        read_spec({"quantization_config": {"quant_method": "gptq"}}),
        read_spec({"quantization_config": {"quant_method": "awq"}}),
    )
    assert (
        check_flag(gptq, "marlin") == check_flag(gptq, None) == check_flag(gptq, "gptq") == "gptq"
    )
    assert check_flag(awq, "marlin") == "awq" and check_flag(None, "eetq") == "eetq"


@pytest.mark.parametrize(
    "config,message",
    [
        ({"quant_method": "awq", "version": "gemv"}, "AWQ's 4-bit `gemm` packing only"),
        ({"quant_method": "gptq", "bits": 3}, "GPTQ checkpoint with 3 bits"),
        ({"quant_method": "hqq"}, "quant_method 'hqq' is not supported"),
        (
            {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"}}}},
            "compressed-tensors format 'nvfp4-pack-quantized'",
        ),
    ],
)  # fmt: skip
def test_formats_tgix_cannot_read_are_refused_by_name(config, message):
    with pytest.raises(QuantizeError, match=message):
        read_spec({"quantization_config": config})


def test_the_engine_serves_a_kept_checkpoint_with_transformers_greedy_ids(checkpoints, monkeypatch):
    from tests.engine.conftest import LIMITS
    from tgix import LLM
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    path, ref_path = checkpoints("gptq-act-order")
    monkeypatch.setenv("TGIX_QUANT_FORM", "kept")
    prompts = [ids(7, 6), ids(8, 11)]
    ref = testing.load_reference_model(ref_path)
    options = EngineOptions(progress=False, compile=False)
    with LLM(str(path), limits=LimitRequest(**LIMITS), options=options) as llm:
        assert llm.engine.quantize == "gptq"
        done = llm.generate(prompts, max_new_tokens=8, ignore_eos=True)
        pool = llm.engine.scheduler.kv
        assert (pool.num_free + pool.num_cached, pool.num_used) == (pool.num_pages - 1, 0)
    beyond = list(range(testing.TOKENIZER_VOCAB_SIZE, 320))  # the engine samples real tokens
    for prompt, completion in zip(prompts, done, strict=True):
        with torch.no_grad():
            want = ref.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, suppress_tokens=beyond
            )
        assert [t.id for t in completion.tokens] == want[0, len(prompt) :].tolist()


def test_the_launcher_exits_1_naming_the_flag_and_the_checkpoint(checkpoints, monkeypatch, capsys):
    from server import main as main_module
    from tgix.serve import build_engine

    monkeypatch.setattr(main_module, "setup_logging", lambda json_output: None)
    path, _ = checkpoints("awq")
    assert main_module.main(["--model-id", str(path), "--quantize", "gptq"], build_engine) == 1
    assert (
        "Invalid argument: `--quantize gptq` contradicts the checkpoint, which is quantized "
        "with `awq`" in capsys.readouterr().err
    )


@pytest.mark.parametrize("shards", [1, 2])
def test_fused_phi3_tensors_kept_quantized_split_into_their_layers(
    tiny_checkpoints, tmp_path, shards
):
    """AWQ's qkv_proj / gate_up_proj each split into q, k, v / gate, up as row maps of one
    GroupedWeight: the logits of transformers on the dequantized weights, on 1 and 2 shards."""
    path = testing_quant.write_awq_checkpoint(
        tiny_checkpoints("phi3"), tmp_path / "q", reference=tmp_path / "ref"
    )
    loaded = load_model(str(path), quantize_form="kept", mesh=make_mesh(model=shards))
    attn = loaded.model.layers[1].self_attn
    assert attn.q_proj.kernel is None and attn.k_proj.codes[...].shape == (32, 20)
    prompt, continuation = ids(6, 13), ids(7, 3)
    with torch.no_grad():
        ref = testing.load_reference_model(tmp_path / "ref")
        full = ref(torch.tensor([prompt + continuation])).logits[0].numpy()
    np.testing.assert_allclose(
        prompt_then_tokens(loaded, prompt, continuation), full, atol=ATOL, rtol=0
    )
