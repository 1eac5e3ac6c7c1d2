"""`/tokenize`'s answer: each token with its text and byte offsets in the input (§2.8).

Offsets come from the fast tokenizer's offset mapping (character offsets in Python) and are
converted to UTF-8 byte offsets, as TGI reports them. A tokenizer without offsets gives TGI's
fallback shape: ids with empty texts and zero offsets.
"""

from __future__ import annotations

from typing import Any


def _byte_positions(text: str) -> list[int]:
    """positions[i] = UTF-8 byte offset of character i (one extra entry for the end)."""
    positions = [0]
    for ch in text:
        positions.append(positions[-1] + len(ch.encode("utf-8", "surrogatepass")))
    return positions


def simple_tokens(tokenizer, text: str, add_special_tokens: bool) -> list[dict[str, Any]]:
    hf = getattr(tokenizer, "hf", None)
    try:
        encoding = hf(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    except Exception:  # no fast tokenizer: TGI's Python-tokenizer fallback shape
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return [{"id": i, "text": "", "start": 0, "stop": 0} for i in ids]
    positions = _byte_positions(text)
    return [
        {"id": i, "text": text[start:stop], "start": positions[start], "stop": positions[stop]}
        for i, (start, stop) in zip(ids, offsets, strict=True)
    ]
