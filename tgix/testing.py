"""Test support: tiny random transformers checkpoints (their configs: testing_configs.py) and
a small byte-level BPE tokenizer.

torch/transformers are imported lazily so this module imports without them.
"""

from __future__ import annotations

import json
import math
import pathlib

from tgix.testing_configs import (  # noqa: F401  (re-exported: the tests' names)
    _BASE,
    _FAMILY_OVERRIDES,
    BOS_ID,
    EOS_ID,
    FAMILIES,
    LLAMA_FAMILIES,
    NEW_FAMILIES,
    PAD_ID,
    SPECULATION_FAMILIES,
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB_SIZE = 300

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2-style pipeline (NFC, this split, byte-level): transformers forces its own Qwen2Tokenizer
# pipeline onto `qwen2` checkpoints, so matching it keeps every loader tokenizing identically.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A small model is served on a tiny machine, "
    "and the tests check that every number it prints matches the reference to the last digit.\n",
    "Once upon a time there was a little engine that could. It read the weights from the disk, "
    "split them across the devices, and then it answered each question with care and patience.\n",
    "In the morning the sun rose over the hills; in the evening the rain fell on the river. "
    "People walked to the market, bought bread and apples, and talked about the weather.\n",
    "Hello, world! How are you today? I am fine, thank you. What is the time? It is ten to nine.\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 3.14159 2.71828 -7 +8 1e-6 0x1F\n",
    '{"name": "tgix", "version": [0, 1, 0], "ok": true, "items": [{"id": 1}, {"id": 2}], '
    '"value": null, "ratio": 0.5}\n',
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber se\u00f1or \u00e9t\u00e9 \u00e0 la carte. "
    "\u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \U0001f600 \U0001f680 \u2764\ufe0f\n",
)


def _make_config(family: str):
    """Build the transformers config object for ``family``."""
    import transformers

    if family not in _FAMILY_OVERRIDES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    class_name, overrides = _FAMILY_OVERRIDES[family]
    kwargs = json.loads(json.dumps({**_BASE, **overrides}))  # deep copy
    return getattr(transformers, class_name)(**kwargs)


def tiny_hf_config(family: str) -> dict:
    """The config.json dict (as transformers would write it) for ``family``."""
    config = _make_config(family)
    config.architectures = [_model_class_name(config)]
    config.dtype = "float32"
    return json.loads(config.to_json_string())


def _model_class_name(config) -> str:
    """Gemma3TextConfig -> Gemma3ForCausalLM, LlamaConfig -> LlamaForCausalLM."""
    return type(config).__name__.replace("TextConfig", "Config").replace("Config", "ForCausalLM")


def _reinit_(model, seed: int) -> None:
    """Re-initialise every parameter so activations and logits are O(1), not near zero (text
    models and the vision-language ones of testing_vlm / testing_qwen_vl alike)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def fill(param, std: float, mean: float = 0.0) -> None:
        if id(param) in done:  # a tied weight is filled once, as the lm_head
            return
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        param.copy_(mean + std * noise)
        done.add(id(param))

    with torch.no_grad():
        # lm_head (and so a tied embedding) gets std D**-0.25: logits std ~ D**0.25, peaked enough
        # that greedy picks are not near-ties, yet far from one-hot. A VLM's D is its decoder's.
        text = getattr(model.config, "text_config", None) or model.config
        fill(model.get_output_embeddings().weight, text.hidden_size**-0.25)
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                fill(module.weight, 1.0)
            elif isinstance(module, torch.nn.Linear | torch.nn.Conv2d | torch.nn.Conv3d):
                fill(module.weight, 1.0 / math.sqrt(module.weight[0].numel()))  # fan-in
                if module.bias is not None:
                    fill(module.bias, 0.2)
            elif isinstance(module, torch.nn.LayerNorm):  # vision towers
                fill(module.weight, 0.2, mean=1.0)
                fill(module.bias, 0.2)
            elif type(module).__name__.endswith("RMSNorm"):  # Gemma's scale by 1 + weight
                fill(module.weight, 0.2, mean=0.0 if "Gemma" in type(module).__name__ else 1.0)
        for name, param in model.named_parameters():  # stacked experts [E, out, in], routers
            if id(param) not in done and param.ndim >= 2 and ("expert" in name or "gate" in name):
                fill(param, 1.0 / math.sqrt(param.shape[-1]))
    missed = [name for name, p in model.named_parameters() if id(p) not in done]
    if missed:
        raise RuntimeError(f"parameters not re-initialised: {missed}")


def write_tiny_checkpoint(
    family: str, path, *, seed: int = 0, sharded: bool = False, overrides: dict | None = None
) -> pathlib.Path:
    """Save a random tiny ``family`` model (safetensors, >=2 shards if ``sharded``) + tokenizer.
    ``overrides`` replace config fields (e.g. head counts for tensor-parallel layouts)."""
    import torch
    import transformers

    path = pathlib.Path(path)
    config = _make_config(family)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model_class = getattr(transformers, _model_class_name(config))
    model = model_class(config).to(torch.float32).eval()
    _reinit_(model, seed)
    shard = {"max_shard_size": "100KB"} if sharded else {}
    model.save_pretrained(path, safe_serialization=True, **shard)
    write_test_tokenizer(path)
    return path


def write_medusa_heads(
    base, path, *, num_heads: int = 3, num_layers: int = 1, layout: str = "v1",
    copy: bool = False, seed: int = 0,
) -> pathlib.Path:  # fmt: skip
    """A Medusa folder for the checkpoint at ``base`` (tgix/models/medusa.py's layout):
    config.json naming ``base`` and ``medusa_lm_head.safetensors`` with ``num_heads`` heads
    of ``num_layers`` residual blocks. ``copy``: blocks of zeros and out projections equal
    to the base LM head, so every head guesses "the next token again" (right whenever the
    text repeats a token); else random blocks and out projections near the LM head.
    ``layout="v2"`` writes no out projections (the heads share the base LM head)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    base, path = pathlib.Path(base), pathlib.Path(path)
    tensors: dict = {}
    for file in sorted(base.glob("*.safetensors")):
        tensors.update(load_file(file))
    lm_head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    vocab, width = lm_head.shape
    rng = np.random.default_rng(seed)
    heads = {}
    for m in range(num_heads):
        for b in range(num_layers):
            w = rng.standard_normal((width, width)) / math.sqrt(width)
            heads[f"{m}.{b}.linear.weight"] = (0 * w if copy else w).astype(np.float32)
            heads[f"{m}.{b}.linear.bias"] = np.full(width, 0.0 if copy else 0.2, np.float32)
        if layout == "v1":
            noise = 0.0 if copy else 0.5 * lm_head.std() * rng.standard_normal(lm_head.shape)
            heads[f"{m}.{num_layers}.weight"] = (lm_head + noise).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(heads, str(path / "medusa_lm_head.safetensors"))
    config = {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": str(base),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def _train_tokenizer():
    """Train the byte-level BPE deterministically on the in-module corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return tok


def write_test_tokenizer(path) -> None:
    """Write tokenizer.json / tokenizer_config.json (ChatML template) for the test BPE."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        unk_token=None,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(path))


def load_reference_model(path):
    """transformers' PyTorch model for ``path``: float32, eval mode, eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()
