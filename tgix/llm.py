"""`tgix.LLM`: the serving engine as a Python object (batched `generate`, streaming `stream`).

    llm = tgix.LLM()                                # the embedded SmolLM2, or a folder/Hub id
    [c] = llm.generate(["The capital of France is"], max_new_tokens=8)
    c.generated_text, c.finish_reason, [t.id for t in c.tokens]
    for event in llm.stream("Once upon a time", max_new_tokens=16, do_sample=True, seed=1): ...
    llm.generate("Paris as JSON:", grammar={"type": "object", "properties": {...}})  # schema
    llm.generate("A year:", grammar=tgix.grammar.GrammarSpec.regex("1[0-9]{3}"))
    vlm = tgix.LLM("HuggingFaceTB/SmolVLM-256M-Instruct")     # a vision-language model
    vlm.generate(vlm.chat_prompt([{"role": "user", "content": [{"type": "image"},
                 {"type": "text", "text": "What is this?"}]}]), images=[pil_image])

Prompts are strings (tokenized with the model's tokenizer, special tokens added as TGI does)
or lists of token ids. All prompts of one `generate` call are submitted at once and share
steps through continuous batching. On a vision-language model `images` (PIL images) go with
a string prompt holding the model's image token once per image (`chat_prompt` writes it;
several prompts take a list of lists).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from tgix.engine.factory import EngineOptions, create_engine
from tgix.engine.limits import LimitRequest
from tgix.engine.request import Completion, GenerationRequest, SamplingParams, TokenEvent
from tgix.models.hub import DEFAULT_MODEL_ID

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_REQUEST_FIELDS = {"stop", "ignore_eos", "top_n_tokens", "prompt_logprobs", "best_of"}


class LLM:
    """Load a model, size and compile an engine, serve it in-process."""

    def __init__(
        self,
        model_id: str | None = None,
        *,
        revision: str | None = None,
        dtype=None,
        mesh=None,
        tokenizer_config_path: str | None = None,
        limits: LimitRequest | None = None,
        options: EngineOptions | None = None,
        quantize: str | None = None,
    ):
        from tgix.models import load_model
        from tgix.tokenizer import load_tokenizer

        loaded = load_model(model_id, revision=revision, dtype=dtype, mesh=mesh, quantize=quantize)
        self.tokenizer = load_tokenizer(loaded.files, tokenizer_config_path=tokenizer_config_path)
        self.engine = create_engine(
            loaded, self.tokenizer, limits, options, model_id=model_id or DEFAULT_MODEL_ID
        )

    def chat_prompt(self, messages: list[dict]) -> str:
        """The model's chat template over `messages`, ready for a reply (image parts as
        {"type": "image"} on a vision-language model)."""
        vision = self.engine.vision
        if vision is not None:
            return vision.processor.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def _request(
        self, prompt: str | Sequence[int], kwargs: dict, images: Sequence | None = None
    ) -> GenerationRequest:
        known = _SAMPLING_FIELDS | _REQUEST_FIELDS | {"max_new_tokens", "grammar"}
        unknown = set(kwargs) - known
        if unknown:
            raise TypeError(f"unknown generation arguments: {sorted(unknown)}")
        spans = None
        if images:
            if self.engine.vision is None or not isinstance(prompt, str):
                raise ValueError("images need a vision-language model and a text prompt")
            ids, spans = self.engine.vision.prepare(prompt, list(images))
        else:
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        sampling = SamplingParams(**{k: v for k, v in kwargs.items() if k in _SAMPLING_FIELDS})
        extra = {k: v for k, v in kwargs.items() if k in _REQUEST_FIELDS}
        if "stop" in extra:
            extra["stop"] = tuple(extra["stop"])
        if kwargs.get("grammar") is not None:
            extra["grammar"] = self._compile_grammar(kwargs["grammar"])
        return GenerationRequest(
            prompt_ids=tuple(ids),
            max_new_tokens=kwargs.get("max_new_tokens", 20),
            sampling=sampling,
            images=spans,
            **extra,
        )

    def _compile_grammar(self, grammar):
        """A GrammarSpec, or a JSON Schema (dict / bool): compiled (cached) to a TokenIndex.
        Raises tgix.grammar.GrammarError."""
        from tgix.grammar import GrammarError, GrammarSpec

        if self.engine.grammar_compiler is None:
            raise GrammarError("grammars are off for this engine (grammar_workers=-1)")
        spec = grammar if isinstance(grammar, GrammarSpec) else GrammarSpec.json(grammar)
        return self.engine.grammar_compiler.compile(spec)

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        *,
        images: Sequence | None = None,
        **kwargs,
    ) -> list[Completion]:
        """Completions for each prompt, in order (blocking). Keyword arguments are
        SamplingParams fields plus max_new_tokens, stop, ignore_eos, top_n_tokens,
        prompt_logprobs, best_of and grammar (a tgix.grammar.GrammarSpec or a JSON Schema).
        Raises GenerationError if a request fails, GrammarError if its grammar cannot be
        compiled. `images`: for one prompt a list of images, for several a list per prompt."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts, images = [prompts], None if images is None else [images]
        per_prompt = images or [None] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(per_prompt)} image lists for {len(prompts)} prompts")
        streams = [
            self.engine.submit(self._request(p, kwargs, imgs))
            for p, imgs in zip(prompts, per_prompt, strict=True)
        ]
        results = []
        for stream in streams:
            *_, final = stream
            results.append(final)
        return results

    def stream(
        self, prompt: str | Sequence[int], *, images: Sequence | None = None, **kwargs
    ) -> Iterator[TokenEvent | Completion]:
        """TokenEvents as they are produced, then the Completion."""
        yield from self.engine.submit(self._request(prompt, kwargs, images))

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
