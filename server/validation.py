"""TGI's request validation (§3): parameter rules in TGI's order, then tokenization, truncation
and the token budget, then the grammar (compiled by the engine's GrammarCompiler), producing
the engine's GenerationRequest.

Tokenization runs in a pool of `--validation-workers` threads so a 2 MB prompt never blocks
the event loop (health checks and streams keep flowing). Every failure is an ApiError 422
with TGI's exact message; the engine only ever sees valid requests.

On a vision-language model, `![](url)` in a prompt is an image (TGI's markdown; the chat
routes write their `image_url` parts so): the images are fetched on a pool of their own (a
slow URL holds no tokenizer thread), then the model's processor and image encoder
(tgix.engine.vision_inputs) give the prompt ids and the image embeddings.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from concurrent.futures import ThreadPoolExecutor

from server import errors
from server.grammar import compile_grammar
from server.images import ImageLimits, load_images, split_markdown
from server.schemas import GenerateParams
from server.settings import Settings
from tgix.engine.request import EngineLimits, GenerationRequest, SamplingParams
from tgix.engine.stop_match import failure_table
from tgix.engine.vision_inputs import ImagePromptError

MIN_SCALE = 1e-6  # smallest temperature / repetition_penalty: logits divided by it stay finite
MAX_STOP_CHARS = 4096  # per stop sequence (TGI: unbounded); matching is linear in it anyway

# TGI checks the budget against at most this many new tokens (§3.3) and serves longer
# requests in chunks; tgix's engine runs them in one go, capped by max_total_tokens.
DEFAULT_GENERATION_LENGTH = 1024


def _stop_tables(tokenizer, stops) -> None:
    for stop in stops:
        failure_table(stop)


def _is_sampling(p: GenerateParams) -> bool:
    """TGI's router-side notion of sampling, used by the best_of rule."""
    return p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p, p.typical_p))


class Validator:
    """Turns (inputs, GenerateParams) into a GenerationRequest or raises TGI's 422.

    Each pool thread works on its own copy of the tokenizer, as each TGI validation worker
    owns one: a fast tokenizer shared between threads can fail with "Already borrowed"."""

    def __init__(
        self, tokenizer, limits: EngineLimits, settings: Settings, compiler=None, vision=None
    ):
        self.shared_tokenizer = tokenizer
        self.limits = limits
        self.settings = settings
        self.compiler = compiler  # tgix.grammar.GrammarCompiler; None: grammars unsupported
        self.vision = vision  # tgix.engine.vision_inputs.VisionPrompts; None: text only
        self.image_limits = ImageLimits(
            max_images=settings.max_images,
            max_bytes=settings.max_image_bytes,
            timeout=settings.image_fetch_timeout,
            allow_private=settings.allow_private_image_urls,
        )
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.validation_workers, thread_name_prefix="tgix-validation"
        )
        self._fetch_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tgix-images")

    @property
    def tokenizer(self):
        """This thread's tokenizer (call from the pool)."""
        tokenizer = getattr(self._local, "tokenizer", None)
        if tokenizer is None:
            try:
                tokenizer = copy.deepcopy(self.shared_tokenizer)
            except Exception:  # not copyable: share it
                tokenizer = self.shared_tokenizer
            self._local.tokenizer = tokenizer
        return tokenizer

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._fetch_pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn, *args):
        """Run `fn(tokenizer, *args)` in the validation pool with that thread's tokenizer."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: fn(self.tokenizer, *args)
        )

    def best_of(self, p: GenerateParams) -> int:
        """The best_of bound check that /generate runs before taking permits."""
        best_of = p.best_of or 1  # best_of 0 is treated as 1
        if best_of > 1:
            maximum = self.settings.max_best_of
            if maximum == 1:
                raise errors.validation("`best_of` != 1 is not allowed for this endpoint")
            if best_of > maximum:
                raise errors.validation(f"`best_of` must be > 0 and <= {maximum}. Given: {best_of}")
        return best_of

    @staticmethod
    def stream_only(p: GenerateParams) -> None:
        """The two rules checked first on streaming routes (§3.2)."""
        if p.best_of is not None and p.best_of > 1:
            raise errors.validation("`best_of` != 1 is not supported when streaming tokens")
        if p.decoder_input_details:
            raise errors.validation(
                "`decoder_input_details` == true is not supported when streaming tokens"
            )

    def sampling(self, p: GenerateParams) -> SamplingParams:
        """Parameter rules, in TGI's order, up to top_n_tokens."""
        best_of = p.best_of or 1
        if best_of > 1 and not _is_sampling(p):
            raise errors.validation("you must use sampling when `best_of` is > 1")
        temperature = 1.0 if p.temperature is None else p.temperature
        if temperature <= 0.0:
            raise errors.validation("`temperature` must be strictly positive")
        if temperature < MIN_SCALE:  # logits / 1e-45 is inf: no distribution to draw from
            raise errors.validation(f"`temperature` must be >= {MIN_SCALE}. Given: {temperature}")
        repetition = 1.0 if p.repetition_penalty is None else p.repetition_penalty
        if repetition <= 0.0:
            raise errors.validation("`repetition_penalty` must be strictly positive")
        if repetition < MIN_SCALE:
            raise errors.validation(
                f"`repetition_penalty` must be >= {MIN_SCALE}. Given: {repetition}"
            )
        frequency = 0.0 if p.frequency_penalty is None else p.frequency_penalty
        if not -2.0 <= frequency <= 2.0:
            raise errors.validation("`frequency_penalty` must be >= -2.0 and <= 2.0")
        presence = 0.0 if p.presence_penalty is None else p.presence_penalty
        if not -2.0 <= presence <= 2.0:
            raise errors.validation("`presence_penalty` must be >= -2.0 and <= 2.0")
        if p.top_p is not None and not 0.0 < p.top_p < 1.0:
            raise errors.validation("`top_p` must be > 0.0 and < 1.0")
        if p.typical_p is not None and not 0.0 < p.typical_p < 1.0:
            raise errors.validation("`typical_p` must be > 0.0 and < 1.0")
        if p.top_k is not None and p.top_k <= 0:
            raise errors.validation("`top_k` must be strictly positive")
        if p.max_new_tokens == 0:
            raise errors.validation("`max_new_tokens` must be strictly positive")
        if len(p.stop) > self.settings.max_stop_sequences:
            raise errors.validation(
                f"`stop` supports up to {self.settings.max_stop_sequences} stop sequences. "
                f"Given: {len(p.stop)}"
            )
        longest = max((len(stop) for stop in p.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise errors.validation(
                f"`stop` sequences must be at most {MAX_STOP_CHARS} characters. Given: {longest}"
            )
        if best_of > 1 and p.seed is not None:
            raise errors.validation("`seed` must not be set when `best_of` > 1")
        if (p.top_n_tokens or 0) > self.settings.max_top_n_tokens:
            raise errors.validation(
                f"`top_n_tokens` must be >= 0 and <= {self.settings.max_top_n_tokens}. "
                f"Given: {p.top_n_tokens}"
            )
        return SamplingParams(
            do_sample=p.do_sample,
            temperature=temperature,
            top_k=p.top_k or 0,
            top_p=1.0 if p.top_p is None else p.top_p,
            typical_p=1.0 if p.typical_p is None else p.typical_p,
            repetition_penalty=repetition,
            frequency_penalty=frequency,
            presence_penalty=presence,
            seed=p.seed,
            watermark=p.watermark,
        )

    @staticmethod
    def _tokenize(tokenizer, inputs: str, add_special_tokens: bool, truncate: int | None):
        try:
            ids = tokenizer.encode(inputs, add_special_tokens=add_special_tokens)
        except Exception as exc:  # a tokenizer failure is the request's fault, never a 500
            raise errors.validation(f"tokenizer error {exc}") from None
        if truncate is not None and len(ids) > truncate:
            ids = ids[-truncate:]  # TGI keeps the last tokens
        return tuple(ids)

    def _has_images(self, inputs) -> bool:
        vision = self.vision
        return (
            vision is not None
            and isinstance(inputs, str)
            and ("![](" in inputs or vision.image_token in inputs)
        )

    async def _with_images(self, inputs: str, add_special_tokens: bool, truncate: int | None):
        """(prompt ids, ImageSpans) of a prompt with images (422 for any bad one)."""
        text, urls = split_markdown(inputs, self.vision.image_token)
        loop = asyncio.get_running_loop()
        images = await loop.run_in_executor(self._fetch_pool, load_images, urls, self.image_limits)
        return await self.run(self._prepare, text, images, add_special_tokens, truncate)

    def _prepare(self, tokenizer, text, images, add_special_tokens, truncate):
        try:
            ids, spans = self.vision.prepare(text, images, add_special_tokens=add_special_tokens)
        except ImagePromptError as exc:
            raise errors.validation(str(exc)) from None
        except Exception as exc:  # the processor refused these images: the request's fault
            raise errors.validation(f"image processor error {exc}") from None
        if truncate is not None and len(ids) > truncate:
            if spans is not None:
                raise errors.validation("`truncate` cannot cut a prompt that holds images")
            ids = ids[-truncate:]
        return ids, spans

    def _token_ids(self, ids: tuple[int, ...], truncate: int | None) -> tuple[int, ...]:
        """A prompt given as token ids (OpenAI completions): each must be in the vocabulary."""
        vocab = getattr(self.shared_tokenizer, "vocab_size", None)
        if vocab is not None:
            for i in ids:
                if not 0 <= i < vocab:
                    raise errors.validation(
                        f"token id {i} is outside the vocabulary (0..{vocab - 1})"
                    )
        return ids[-truncate:] if truncate is not None and len(ids) > truncate else ids

    async def validate(
        self, inputs: str | tuple[int, ...], p: GenerateParams, *, add_special_tokens: bool = True
    ) -> GenerationRequest:
        """All of §3.2 after the permit: parameters, inputs, tokens, budget, grammar. `inputs`
        is text, or token ids taken as they are (no special tokens added)."""
        sampling = self.sampling(p)
        if not inputs:
            raise errors.validation("`inputs` cannot be empty")
        max_input, max_total = self.limits.max_input_tokens, self.limits.max_total_tokens
        if p.truncate is not None and not 0 < p.truncate <= max_input:
            raise errors.validation(
                "`truncate` must be strictly positive and less than "
                f"{max_input}. Given: {p.truncate}"
            )
        images = None
        if isinstance(inputs, tuple):
            ids = self._token_ids(inputs, p.truncate)
        elif self._has_images(inputs):
            ids, images = await self._with_images(inputs, add_special_tokens, p.truncate)
        else:
            ids = await self.run(self._tokenize, inputs, add_special_tokens, p.truncate)
        input_length = len(ids)
        room = max(max_total - input_length, 0)
        if p.max_new_tokens is None:
            checked, max_new_tokens = room, room
        else:
            checked = min(p.max_new_tokens, DEFAULT_GENERATION_LENGTH)
            max_new_tokens = min(p.max_new_tokens, room)  # TGI: silently shorter (§3.3)
        if input_length + checked > max_total:
            given = p.max_new_tokens if p.max_new_tokens is not None else room
            raise errors.validation(
                f"`inputs` tokens + `max_new_tokens` must be <= {max_total}. "
                f"Given: {input_length} `inputs` tokens and {given} `max_new_tokens`"
            )
        if input_length > max_input:
            raise errors.validation(
                f"`inputs` must have less than {max_input} tokens. Given: {input_length}"
            )
        if any(len(stop) > 64 for stop in p.stop):  # the engine thread only looks them up
            await self.run(_stop_tables, p.stop)
        grammar = None
        if p.grammar is not None:
            disabled = self.settings.disable_grammar_support
            grammar = await compile_grammar(self.compiler, disabled, p.grammar)
        return GenerationRequest(
            prompt_ids=ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=tuple(p.stop),
            top_n_tokens=p.top_n_tokens or 0,
            prompt_logprobs=p.decoder_input_details and self.settings.enable_prefill_logprobs,
            best_of=p.best_of or 1,
            grammar=grammar,
            ignore_eos=p.ignore_eos,
            images=images,
        )
