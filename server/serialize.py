"""Engine results -> TGI's JSON shapes (§2.3, §2.4), with serde's key order.

Key order follows TGI's Rust structs: Token {id, text, logprob, special}; Details
{finish_reason, generated_tokens, seed, prefill, tokens, best_of_sequences?, top_tokens?};
StreamResponse {index, token, top_tokens?, generated_text, details}. Optional lists are
omitted when empty, as `skip_serializing_if` does. Logprobs are written as float32.
"""

from __future__ import annotations

from typing import Any

from server.jsonio import f32
from tgix.engine.request import Completion, TokenEvent, TokenInfo


def token(t: TokenInfo) -> dict[str, Any]:
    return {"id": t.id, "text": t.text, "logprob": f32(t.logprob), "special": t.special}


def prefill_token(t: TokenInfo) -> dict[str, Any]:
    return {"id": t.id, "text": t.text, "logprob": f32(t.logprob)}


def _top_tokens(top: tuple[tuple[TokenInfo, ...], ...]) -> list[list[dict[str, Any]]]:
    return [[token(t) for t in step] for step in top]


def _sequence(c: Completion) -> dict[str, Any]:
    """The fields Details and BestOfSequence share, in their order."""
    return {
        "finish_reason": c.finish_reason,
        "generated_tokens": c.generated_tokens,
        "seed": c.seed,
        "prefill": [prefill_token(t) for t in c.prefill],
        "tokens": [token(t) for t in c.tokens],
    }


def details(c: Completion, prefix: str = "") -> dict[str, Any]:
    out = _sequence(c)
    if c.best_of_sequences:
        out["best_of_sequences"] = [best_of_sequence(s, prefix) for s in c.best_of_sequences]
    if c.top_tokens:
        out["top_tokens"] = _top_tokens(c.top_tokens)
    return out


def best_of_sequence(c: Completion, prefix: str) -> dict[str, Any]:
    out = {"generated_text": prefix + c.generated_text, **_sequence(c)}
    if c.top_tokens:
        out["top_tokens"] = _top_tokens(c.top_tokens)
    return out


def generate_response(c: Completion, *, with_details: bool, prefix: str = "") -> dict[str, Any]:
    """GenerateResponse: `details` only when details or decoder_input_details was asked."""
    out: dict[str, Any] = {"generated_text": prefix + c.generated_text}
    if with_details:
        out["details"] = details(c, prefix)
    return out


def stream_response(
    ev: TokenEvent,
    final: Completion | None,
    *,
    with_details: bool,
    prefix: str = "",
) -> dict[str, Any]:
    """One StreamResponse; the last token carries generated_text (and details if asked)."""
    out: dict[str, Any] = {"index": ev.index, "token": token(ev.token)}
    if ev.top_tokens:
        out["top_tokens"] = [token(t) for t in ev.top_tokens]
    out["generated_text"] = None if final is None else prefix + final.generated_text
    out["details"] = None
    if final is not None and with_details:
        out["details"] = {
            "finish_reason": final.finish_reason,
            "generated_tokens": final.generated_tokens,
            "seed": final.seed,
            "input_length": final.input_length,
        }
    return out


def last_event(final: Completion, previous_index: int) -> TokenEvent | None:
    """A final event rebuilt from a Completion that arrived apart from its last token (an
    engine breaking the delivery contract): the last token again, same index."""
    if not final.tokens:
        return None
    top = final.top_tokens[-1] if final.top_tokens else ()
    return TokenEvent(index=max(previous_index, 1), token=final.tokens[-1], top_tokens=top)
