"""The bytes each token id adds to the output, the input the token index walks.

Tokenizers store tokens in their own alphabets: byte-level BPE maps every byte to a printable
character (GPT-2's table: `Ġ` = space, `Ċ` = newline, ...); SentencePiece writes spaces as
`▁` and bytes it cannot spell as `<0xNN>` (byte fallback). Reading the HF decoder config tells
which applies, so tokens map back to the raw bytes a model emits, including tokens that hold
only part of a UTF-8 character. Special tokens never match text; ids past the tokenizer (logit
padding) have no bytes; EOS ids are the only way to finish.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_inverse() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable characters stand for themselves, the
    other bytes are shifted to U+0100 upwards in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@dataclass(frozen=True, slots=True)
class TokenVocabulary:
    """token_bytes[i]: bytes of id i, or None (special, padding, or empty: never allowed as
    text). size: the model's logit width V (>= tokenizer length). eos_ids: ids that end a
    generation; allowed exactly where the grammar accepts."""

    token_bytes: tuple[bytes | None, ...]
    eos_ids: tuple[int, ...]
    size: int

    def digest(self) -> str:
        """Content hash: part of every compiled-grammar cache key."""
        h = hashlib.sha256(repr((self.eos_ids, self.size)).encode())
        for b in self.token_bytes:
            h.update(b"\xff" if b is None else len(b).to_bytes(2, "little") + b)
        return h.hexdigest()[:32]

    @classmethod
    def from_tokenizer(
        cls, tokenizer, *, eos_ids: Sequence[int] = (), size: int | None = None
    ) -> TokenVocabulary:
        """From a transformers fast tokenizer. eos_ids default to its eos_token_id. size: the
        model's logit width (default: the tokenizer's length); ids past the tokenizer are
        padding (no bytes), tokenizer ids past it can never be sampled (dropped)."""
        hf = getattr(tokenizer, "hf", tokenizer)  # tgix.tokenizer.Tokenizer or a HF one
        n = len(hf)
        size = n if size is None else size
        eos = tuple(eos_ids) or ((hf.eos_token_id,) if hf.eos_token_id is not None else ())
        decode = _token_decoder(hf)
        special = set(hf.all_special_ids)
        added = {i: t for i, t in hf.added_tokens_decoder.items()}
        out: list[bytes | None] = []
        for i, piece in enumerate(hf.convert_ids_to_tokens(list(range(n)))):
            if i in special or piece is None or (i in added and added[i].special):
                out.append(None)
            elif i in added:  # added non-special tokens are stored as plain text
                out.append(added[i].content.encode() or None)
            else:
                out.append(decode(piece) or None)
        out = (out + [None] * (size - n))[:size]
        for e in eos:
            if not 0 <= e < size:
                raise ValueError(f"EOS id {e} is outside the vocabulary of {size}")
        return cls(tuple(out), eos, size)


def _token_decoder(hf):
    """piece -> bytes for this tokenizer's alphabet, read from its decoder config."""
    config = json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {}
    kinds = _decoder_kinds(config)
    if "ByteLevel" in kinds:
        inverse = _byte_level_inverse()

        def byte_level(piece: str) -> bytes | None:
            try:
                return bytes(inverse[c] for c in piece)
            except KeyError:  # not in GPT-2's alphabet: an ordinary string
                return piece.encode()

        return byte_level
    space = _replaced_space(config)
    byte_fallback = "ByteFallback" in kinds

    def sentencepiece(piece: str) -> bytes | None:
        if byte_fallback and (m := _BYTE_FALLBACK.match(piece)):
            return bytes([int(m.group(1), 16)])
        return piece.replace(space, " ").encode() if space else piece.encode()

    return sentencepiece


def _decoder_kinds(config: dict) -> set[str]:
    kinds = {config.get("type", "")}
    for inner in config.get("decoders") or ():
        kinds |= _decoder_kinds(inner)
    return kinds


def _replaced_space(config: dict) -> str | None:
    """The character a Replace decoder turns into a space (SentencePiece's `▁`)."""
    if config.get("type") == "Replace" and config.get("content") == " ":
        pattern = config.get("pattern") or {}
        return pattern.get("String")
    if config.get("type") == "Metaspace":
        return config.get("replacement", "\u2581")
    for inner in config.get("decoders") or ():
        if found := _replaced_space(inner):
            return found
    return None
