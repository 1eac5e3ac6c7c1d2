"""Tokenizer and chat template, from a model folder or converted once from a GGUF file.

transformers does the work: fast tokenizers from `tokenizer.json`, GGUF vocabularies converted
by its GGUF integration, and chat templates rendered in its sandboxed Jinja environment. A GGUF
conversion takes seconds, so its result is saved as `tokenizer.json` in a cache folder keyed by
the file's path, size and mtime, and later starts load that instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tgix.models.hub import ModelFiles


def cache_root() -> Path:
    """$TGIX_CACHE, else ~/.cache/tgix."""
    return Path(os.environ.get("TGIX_CACHE", Path.home() / ".cache" / "tgix"))


class Tokenizer:
    """Encode, decode and chat-template text for one model."""

    def __init__(self, hf_tokenizer, extra_eos_ids: Sequence[int] = ()):
        self.hf = hf_tokenizer
        eos = [hf_tokenizer.eos_token_id] if hf_tokenizer.eos_token_id is not None else []
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos, *extra_eos_ids]))
        # a vision model's image placeholder (its processor's image token; set by the engine
        # factory): chat templates write it where each image goes
        self.image_token: str | None = None

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (the model's V may be larger: padding)."""
        return len(self.hf)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def chat_template(self) -> str | None:
        return self.hf.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render messages to the prompt text with the model's own template (sandboxed Jinja)."""
        if not self.hf.chat_template:
            raise ValueError("this model has no chat template")
        return self.hf.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )


def load_tokenizer(
    files: ModelFiles,
    *,
    tokenizer_config_path: str | Path | None = None,
    extra_eos_ids: Sequence[int] = (),
) -> Tokenizer:
    """The tokenizer of a resolved model. `tokenizer_config_path` (TGI's flag) overrides the
    chat template and special tokens with those of another tokenizer_config.json. Its EOS
    set is the tokenizer's eos token, `extra_eos_ids`, and every eos_token_id of the
    folder's generation_config.json and config.json (Llama 3's <|eot_id|>, Gemma's
    <end_of_turn>, Phi-3's <|end|>: chat models end turns with ids the tokenizer's own eos
    is not), as TGI and vLLM stop on them; an eos_token in `tokenizer_config_path` replaces
    the folder's."""
    from transformers import AutoTokenizer

    folder = files.folder if files.kind == "safetensors" else _gguf_tokenizer_dir(files.path)
    hf = AutoTokenizer.from_pretrained(folder)
    if tokenizer_config_path is not None:
        overrides = json.loads(Path(tokenizer_config_path).read_text())
        if "chat_template" in overrides:
            hf.chat_template = overrides["chat_template"]
        for key in ("bos_token", "eos_token", "pad_token"):
            token = overrides.get(key)
            if isinstance(token, dict):
                token = token.get("content")
            if token:
                setattr(hf, key, token)
    overridden = tokenizer_config_path is not None and "eos_token" in overrides
    if files.kind == "safetensors" and not overridden:  # an overridden eos token is the choice
        extra_eos_ids = (*extra_eos_ids, *checkpoint_eos_ids(files.folder, len(hf)))
    return Tokenizer(hf, extra_eos_ids)


def checkpoint_eos_ids(folder: Path, vocab_size: int) -> tuple[int, ...]:
    """eos_token_id (an int or a list) of generation_config.json, then config.json (and its
    text_config), ids the tokenizer has only."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if not path.exists():
            continue
        config = json.loads(path.read_text())
        for source in (config, config.get("text_config") or {}):
            value = source.get("eos_token_id")
            ids += value if isinstance(value, list) else [] if value is None else [value]
    return tuple(dict.fromkeys(int(i) for i in ids if 0 <= int(i) < vocab_size))


def _gguf_tokenizer_dir(gguf_file: Path) -> Path:
    """Convert a GGUF vocabulary to a transformers tokenizer folder once; reuse it after."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    target = cache_root() / "tokenizers" / key.hexdigest()[:20]
    if (target / "tokenizer.json").exists():
        return target
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        hf.save_pretrained(scratch)
        scratch.rename(target)  # atomic: a concurrent start sees all files or none
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        if not (target / "tokenizer.json").exists():
            raise
    return target
