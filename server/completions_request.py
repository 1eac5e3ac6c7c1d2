"""POST /v1/completions requests as vLLM reads them: the prompt forms, `echo`, `logprobs`,
`n`, `stream_options`, and the range checks, on top of TGI's CompletionRequest.

`prompt` is a string, a list of strings, a list of token ids, or a list of such lists (TGI:
strings only); each prompt yields `n` choices, numbered prompt-major (choice i * n + j), as
vLLM does. `logprobs: k` asks for each token's logprob and its k best alternatives; with
`echo` the prompt's tokens are scored too, which needs the engine's prompt logprobs
(`--enable-prefill-logprobs`). `max_tokens: 0` is allowed with `echo` (score the prompt,
generate nothing), as lm-evaluation-harness's loglikelihood requests do.
"""

from __future__ import annotations

from dataclasses import dataclass

from server import errors
from server.chat import sampling_params, stream_usage
from server.errors import ApiError
from server.fields import Fields, check, deserialize_error
from server.schemas import GenerateParams
from server.settings import Settings

Prompt = str | tuple[int, ...]


@dataclass(slots=True)
class CompletionRequest:
    prompts: list[Prompt]
    params: GenerateParams
    stream: bool
    n: int = 1
    echo: bool = False
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    include_usage: bool = False
    score_only: bool = False  # max_tokens 0 with echo: the one generated token is dropped


def _prompts(value) -> list[Prompt]:
    if isinstance(value, str):
        return [value]
    items = check(value, "list", "prompt")
    if not items:
        raise deserialize_error(
            "prompt", "Empty array detected. Do not use an empty array for the prompt."
        )
    if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return [_token_ids(items, "prompt")]
    if all(isinstance(v, str) for v in items):
        return list(items)
    if all(isinstance(v, list) for v in items):
        return [_token_ids(v, f"prompt[{i}]") for i, v in enumerate(items)]
    raise deserialize_error(
        "prompt", "expected a string, a list of strings, token ids, or lists of token ids"
    )


def _token_ids(value: list, path: str) -> tuple[int, ...]:
    if not value:
        raise errors.validation("`inputs` cannot be empty")
    return tuple(check(v, "u32", f"{path}[{i}]") for i, v in enumerate(value))


def _n(f: Fields, settings: Settings, prompts: int) -> int:
    n = f.optional("n", "u32", 1)
    limit = settings.max_concurrent_requests
    if n < 1:
        raise errors.validation(f"`n` must be strictly positive. Given: {n}")
    if n * prompts > limit:
        raise errors.validation(
            f"`n` x prompts must be <= {limit} (--max-concurrent-requests). Given: {n} x {prompts}"
        )
    return n


def parse_completion(value, settings: Settings) -> CompletionRequest:
    f = Fields(value, "CompletionRequest")
    prompts = _prompts(f.required("prompt", "any"))
    if f.value.get("suffix") is not None:
        raise ApiError(
            422,
            "Suffix is not supported and can be achieved by preprocessing the prompt.",
            "suffix not supported",
        )
    max_batch = settings.max_client_batch_size
    if len(prompts) > max_batch:
        raise ApiError(
            422,
            f"Number of prompts exceeds the maximum allowed batch size of {max_batch}",
            "batch size exceeded",
        )
    echo = bool(f.optional("echo", "bool", False))
    max_tokens = f.optional("max_tokens", "u32")
    score_only = echo and max_tokens == 0
    params = sampling_params(f, max_tokens=1 if score_only else max_tokens)
    logprobs = f.optional("logprobs", "u32")
    if logprobs is not None and logprobs > settings.max_top_n_tokens:
        raise errors.validation(
            f"`logprobs` must be >= 0 and <= {settings.max_top_n_tokens}. Given: {logprobs}"
        )
    stream = f.flag("stream")
    if logprobs is not None:
        params.top_n_tokens = logprobs
        if echo:
            if stream:
                raise errors.validation("`echo` with `logprobs` is not supported when streaming")
            if not settings.enable_prefill_logprobs:
                raise errors.validation(
                    "`echo` with `logprobs` scores the prompt, which needs the server "
                    "started with --enable-prefill-logprobs"
                )
            params.decoder_input_details = True
    return CompletionRequest(
        prompts=prompts,
        params=params,
        stream=stream,
        n=_n(f, settings, len(prompts)),
        echo=echo,
        logprobs=logprobs,
        include_usage=stream_usage(f, stream),
        score_only=score_only,
    )
