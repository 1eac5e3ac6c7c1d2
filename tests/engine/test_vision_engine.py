"""Vision-language models (tiny random Idefics3, SmolVLM and Qwen2.5-VL, M-RoPE included)
through the engine: for 1, 2 and 3 images of different sizes and aspect ratios, the prompt
ids equal the processor's, the image embeddings transformers' encoder, and the greedy ids and
their logprobs (with the top alternatives) transformers' `generate`; image requests batched
with text-only ones; chunked prefill across an image; the prefix cache reuses an image
prompt's pages and never serves one image's KV for another."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.engine.conftest import make_engine, release_engines, wait_idle
from tgix import testing_qwen_vl, testing_vlm
from tgix.engine.request import GenerationRequest

NEW_TOKENS = 8
SIZES = ((24, 40), (61, 17), (64, 64))  # (height, width)
LIMITS = dict(max_total_tokens=512, max_batch_prefill_tokens=1024, max_batch_total_tokens=4096,
              max_batch_size=4, compile=False, warmup=False, max_top_n_tokens=3)  # fmt: skip


def random_image(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def chat_text(processor, count: int, question: str = "What is in these images?") -> str:
    parts = [{"type": "image"}] * count + [{"type": "text", "text": question}]
    return processor.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True
    )


@pytest.fixture(scope="module", params=["idefics3", "smolvlm", "qwen2_5_vl"])
def setup(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen2_5_vl":
        path = testing_qwen_vl.write_tiny_qwen25_vl(folder)
        reference = testing_qwen_vl.load_reference_vl(path)
    else:
        path = testing_vlm.write_tiny_idefics3(folder, model_type=request.param)
        reference = testing_vlm.load_reference_vlm(path)
    engine = make_engine(path, None, **LIMITS)
    yield engine, reference, path
    release_engines([engine])


def reference_greedy(reference, processor, text, images, n=NEW_TOKENS):
    """transformers' generate: (ids, logprob of each, top-3 (id, logprob) at each step)."""
    if images:
        batch = processor_tensors(processor, text, images)
    else:
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        batch = {"input_ids": torch.tensor([ids])}
    with torch.no_grad():
        out = reference.generate(
            **batch, max_new_tokens=n, do_sample=False, output_logits=True,
            return_dict_in_generate=True, eos_token_id=None,
        )  # fmt: skip
    ids = out.sequences[0, batch["input_ids"].shape[1] :].tolist()
    vocab = len(processor.tokenizer)  # the engine samples the tokenizer's ids only
    logprobs = [torch.log_softmax(step[0, :vocab].double(), -1) for step in out.logits]
    chosen = [float(lp[i]) for lp, i in zip(logprobs, ids, strict=True)]
    tops = [[(int(i), float(lp[i])) for i in torch.topk(lp, 3).indices] for lp in logprobs]
    return ids, chosen, tops, batch["input_ids"][0].tolist()


def processor_tensors(processor, text, images) -> dict:
    """The processor's arrays as torch tensors (tgix's Qwen processor gives numpy only)."""
    out = processor(text=[text], images=[images], return_tensors="np", add_special_tokens=False)
    return {k: torch.from_numpy(np.asarray(v)) for k, v in out.items()}


def reference_features(reference, batch) -> np.ndarray:
    """transformers' image features [N, D], concatenated in prompt order."""
    second = batch.get("image_grid_thw", batch.get("pixel_attention_mask"))
    with torch.no_grad():
        features = reference.get_image_features(batch["pixel_values"], second).pooler_output
    return torch.cat(list(features)).reshape(-1, features[0].shape[-1]).numpy()


def engine_greedy(engine, ids, spans, n=NEW_TOKENS):
    request = GenerationRequest(
        prompt_ids=ids, max_new_tokens=n, images=spans, ignore_eos=True, top_n_tokens=3
    )
    return engine.submit(request)


def check(final, expected):
    ids, chosen, tops, _ = expected
    assert [t.id for t in final.tokens] == ids
    np.testing.assert_allclose([t.logprob for t in final.tokens], chosen, atol=1e-4)
    for got, want in zip(final.top_tokens, tops, strict=True):
        assert [t.id for t in got] == [i for i, _ in want]
        np.testing.assert_allclose([t.logprob for t in got], [lp for _, lp in want], atol=1e-4)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_images_greedy_equals_transformers(setup, count):
    engine, reference, path = setup
    vision = engine.vision
    images = [random_image(*SIZES[i], seed=10 * count + i) for i in range(count)]
    text = chat_text(vision.processor, count)
    ids, spans = vision.prepare(text, images, add_special_tokens=False)
    expected = reference_greedy(reference, vision.processor, text, images)
    assert list(ids) == expected[3]  # the processor's expansion, tile rows and all
    assert spans.count == count and len(spans.positions) == len(spans.embeds)
    features = reference_features(reference, processor_tensors(vision.processor, text, images))
    np.testing.assert_allclose(spans.embeds, features, atol=1e-4)
    check(list(engine_greedy(engine, ids, spans))[-1], expected)
    wait_idle(engine)


def test_image_requests_batched_with_text_only_ones(setup):
    engine, reference, path = setup
    vision = engine.vision
    work = []
    for i, count in enumerate((2, 0, 1, 0)):
        images = [random_image(*SIZES[(i + j) % 3], seed=100 + i * 7 + j) for j in range(count)]
        text = chat_text(vision.processor, count, f"Question {i}: tell me more.")
        ids, spans = vision.prepare(text, images, add_special_tokens=False)
        assert (spans is None) == (count == 0)
        work.append((ids, spans, reference_greedy(reference, vision.processor, text, images)))
    streams = [engine_greedy(engine, ids, spans) for ids, spans, _ in work]
    for stream, (_, _, expected) in zip(streams, work, strict=True):
        check(list(stream)[-1], expected)
    wait_idle(engine)


def test_prefix_cache_reuses_an_image_prompt_and_keys_on_the_image(setup):
    engine, reference, path = setup
    vision = engine.vision
    text = chat_text(vision.processor, 1, "Describe it.")
    first, other = random_image(40, 40, seed=7), random_image(40, 40, seed=8)
    ids, spans = vision.prepare(text, [first], add_special_tokens=False)
    ids_other, spans_other = vision.prepare(text, [other], add_special_tokens=False)
    assert ids == ids_other and spans.digest != spans_other.digest  # same tokens, other pixels
    before = wait_idle(engine)
    list(engine_greedy(engine, ids, spans))
    again = list(engine_greedy(engine, ids, spans))[-1]
    hit = wait_idle(engine)
    assert hit["prefix_hit_tokens"] > before["prefix_hit_tokens"]
    check(again, reference_greedy(reference, vision.processor, text, [first]))
    # the other image: only the pages before the image token may be reused
    final = list(engine_greedy(engine, ids_other, spans_other))[-1]
    after = wait_idle(engine)
    page = engine.limits.page_size
    reused = after["prefix_hit_tokens"] - hit["prefix_hit_tokens"]
    assert reused <= int(spans_other.positions[0]) // page * page
    check(final, reference_greedy(reference, vision.processor, text, [other]))


def test_llm_generate_and_stream_with_images(setup):
    import tgix
    from tgix.engine.factory import EngineOptions
    from tgix.engine.limits import LimitRequest

    engine, reference, path = setup
    options = EngineOptions(compile=False, warmup=False, progress=False, compilation_cache="")
    limits = LimitRequest(max_total_tokens=512, max_batch_prefill_tokens=1024,
                          max_batch_total_tokens=2048, max_batch_size=2)  # fmt: skip
    images = [random_image(33, 47, seed=1), random_image(50, 20, seed=2)]
    parts = [{"type": "image"}, {"type": "text", "text": "Compare"}, {"type": "image"}]
    greedy = dict(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    with tgix.LLM(path, limits=limits, options=options) as llm:
        prompt = llm.chat_prompt([{"role": "user", "content": parts}])
        [one] = llm.generate(prompt, images=images, **greedy)
        *_, streamed = llm.stream(prompt, images=images, **greedy)
        both = llm.generate([prompt, "plain text"], images=[images, None], **greedy)
        with pytest.raises(ValueError, match="2 image placeholders for 1 images"):
            llm.generate(prompt, images=images[:1])
    # tgix.LLM adds special tokens as /generate does (this tokenizer adds none)
    expected = reference_greedy(reference, engine.vision.processor, prompt, images)
    assert one.input_length == len(expected[3])
    assert [t.id for t in one.tokens] == expected[0]
    assert [t.id for t in streamed.tokens] == [t.id for t in one.tokens]
    assert [t.id for t in both[0].tokens] == [t.id for t in one.tokens]
    assert both[1].input_length == len(engine.tokenizer.encode("plain text"))


def test_chunked_prefill_splits_an_image_across_steps(setup):
    engine, reference, path = setup
    chunked = make_engine(path, None, **{**LIMITS, "max_batch_prefill_tokens": 16,
                                        "chunked_prefill": True})  # fmt: skip
    try:
        vision = chunked.vision
        images = [random_image(40, 64, seed=3), random_image(64, 30, seed=4)]
        text = chat_text(vision.processor, 2)
        ids, spans = vision.prepare(text, images, add_special_tokens=False)
        assert spans.positions[-1] - spans.positions[0] > 16  # images over several chunks
        plain = engine_greedy(chunked, (7, 8, 9), None)  # decodes beside the chunks
        final = list(engine_greedy(chunked, ids, spans))[-1]
        list(plain)
        check(final, reference_greedy(reference, vision.processor, text, images))
        wait_idle(chunked)
    finally:
        release_engines([chunked])
