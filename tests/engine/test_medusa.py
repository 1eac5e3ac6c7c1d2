"""Medusa heads (--speculate with a Medusa folder): the loader's checks, the heads' numbers
against a numpy reference on transformers' hidden states, the drafts the engine verifies
being exactly the heads' guesses at the right position, and output unchanged by them (every
family, mixed batches, stops, EOS, max_new_tokens, grammar rows, seeded sampling)."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.engine.conftest import make_engine, release_engines
from tests.engine.test_engine import greedy, ids, prompt
from tests.engine.test_speculate import collect
from tgix import testing
from tgix.engine.request import GenerationRequest, SamplingParams
from tgix.engine.speculate import MedusaProposer, speculate_for
from tgix.grammar import GrammarSpec
from tgix.models import CheckpointError, load_model
from tgix.models.medusa import HEADS_FILE

VOCAB = testing.TOKENIZER_VOCAB_SIZE


@pytest.fixture(scope="module")
def medusa(tiny_checkpoints, tmp_path_factory):
    """(family, layout, copy, heads, layers) -> a Medusa folder for that tiny checkpoint."""
    made = {}

    def get(family="llama", layout="v1", copy=False, heads=3, layers=1):
        key = (family, layout, copy, heads, layers)
        if key not in made:
            made[key] = testing.write_medusa_heads(
                tiny_checkpoints(family), tmp_path_factory.mktemp("medusa"),
                num_heads=heads, num_layers=layers, layout=layout, copy=copy,
            )  # fmt: skip
        return made[key]

    return get


def reference_drafts(folder, hidden: np.ndarray, lm_head: np.ndarray) -> np.ndarray:
    """numpy Medusa heads: hidden [S, D] -> argmax ids [S, M] over the tokenizer's ids."""
    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / HEADS_FILE)
    out = []
    for m in range(cfg["medusa_num_heads"]):
        y = hidden.astype(np.float64)
        for b in range(cfg["medusa_num_layers"]):
            z = y @ tensors[f"{m}.{b}.linear.weight"].T + tensors[f"{m}.{b}.linear.bias"]
            y = y + z / (1 + np.exp(-z))
        proj = tensors.get(f"{m}.{cfg['medusa_num_layers']}.weight", lm_head)
        out.append(np.argmax((y @ proj.T)[:, :VOCAB], axis=-1))
    return np.stack(out, axis=1)


def torch_hidden(base, token_ids) -> tuple[np.ndarray, np.ndarray]:
    """transformers' final normed hidden states [S, D] for token_ids, and its LM head."""
    import torch

    model = testing.load_reference_model(base)
    with torch.no_grad():
        out = model.model(torch.tensor([list(token_ids)])).last_hidden_state[0]
    return out.numpy(), model.get_output_embeddings().weight.detach().numpy()


# ---------------------------------------------------------------------------- loading


def test_speculate_defaults_to_the_heads_and_refuses_more():
    assert speculate_for(None, 0) == 0 and speculate_for(None, 4) == 4
    assert speculate_for(2, 4) == 2 and speculate_for(0, 4) == 0 and speculate_for(6, 0) == 6
    with pytest.raises(ValueError, match="has 4 heads, so at most 4 draft tokens"):
        speculate_for(5, 4)


@pytest.mark.parametrize(("layout", "layers"), [("v1", 1), ("v2", 1), ("v1", 2)])
def test_heads_match_a_numpy_reference(medusa, tiny_checkpoints, layout, layers):
    base, folder = tiny_checkpoints("llama"), medusa(layout=layout, layers=layers)
    loaded = load_model(str(folder))
    assert loaded.files.path == base and loaded.draft_heads == 3
    heads = loaded.model.medusa
    assert (heads.out is None) == (layout == "v2") and heads.w.shape == (3, layers, 40, 40)
    hidden, lm_head = torch_hidden(base, prompt(5, 12))
    got = heads(jnp.asarray(hidden), loaded.model.head_weight(), VOCAB)
    np.testing.assert_array_equal(np.asarray(got), reference_drafts(folder, hidden, lm_head))


def test_tied_embeddings_v2_heads_read_the_embedding_table(medusa, tiny_checkpoints):
    folder = medusa("smollm", layout="v2")
    loaded = load_model(str(folder))
    hidden, lm_head = torch_hidden(tiny_checkpoints("smollm"), prompt(6, 9))
    got = loaded.model.medusa(jnp.asarray(hidden), loaded.model.head_weight(), VOCAB)
    np.testing.assert_array_equal(np.asarray(got), reference_drafts(folder, hidden, lm_head))


def _broken(folder, tmp_path, edit, config_edit=None):
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = dict(load_file(folder / HEADS_FILE))
    edit(tensors)
    save_file(tensors, str(bad / HEADS_FILE))
    config = json.loads((folder / "config.json").read_text())
    config.update(config_edit or {})
    (bad / "config.json").write_text(json.dumps(config))
    return bad


@pytest.mark.parametrize(
    ("edit", "config_edit", "message"),
    [
        (lambda t: t.pop("1.0.linear.bias"), None, r"lacks 1 tensor\(s\): 1.0.linear.bias"),
        (lambda t: t.pop("2.1.weight"), None, r"some heads have output projections, not \['2.1"),
        (lambda t: t.update({"3.0.linear.bias": t["0.0.linear.bias"]}), None, "outside 3 heads"),
        (lambda t: t.update({"0.0.scale": t["0.0.linear.bias"]}), None, "unexpected tensor"),
        (lambda t: t.update({"0.0.linear.bias": t["0.0.linear.bias"][:5]}), None, r"\(5,\)"),
        (lambda t: None, {"medusa_num_heads": 0}, "positive integer"),
        (lambda t: None, {"base_model_name_or_path": None}, "needs base_model_name_or_path"),
        (lambda t: None, {"medusa_num_heads": 4}, "lacks"),
    ],
)
def test_incomplete_heads_are_refused(medusa, tmp_path, edit, config_edit, message):
    bad = _broken(medusa(), tmp_path, edit, config_edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(str(bad))


def test_a_medusa_folder_without_its_file_is_refused(medusa, tmp_path):
    (tmp_path / "config.json").write_text((medusa() / "config.json").read_text())
    (tmp_path / "x.safetensors").write_bytes((medusa() / HEADS_FILE).read_bytes())
    with pytest.raises(CheckpointError, match=f"without {HEADS_FILE}"):
        load_model(str(tmp_path))


# ---------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engines(medusa, tiny_checkpoints, xla_cache):
    """(family, copy, speculate) -> a Medusa engine; ("plain", family) -> one without."""
    made = {}

    def get(family="llama", copy=False, speculate=None, layout="v1", **kw):
        key = (family, copy, speculate, layout, tuple(sorted(kw.items())))
        if key not in made:
            path = tiny_checkpoints(family) if speculate == 0 else medusa(family, layout, copy)
            made[key] = make_engine(
                path, xla_cache, speculate=speculate, compile=False, verify_tokens=16, **kw
            )
        return made[key]

    yield get
    release_engines(made.values())


class Recording(MedusaProposer):
    """The engine's Medusa proposer, remembering each draft with the ids it followed."""

    def __init__(self):
        self.seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def propose(self, seq, k):
        drafts = super().propose(seq, k)
        if drafts:
            self.seen.append((tuple(seq.all_ids()), drafts))
        return drafts


def same_as_plain(engines, requests, family="llama", **kw):
    """Completions with Medusa drafts equal those without; streamed ids equal the final."""
    plain = collect(engines(family, speculate=0), requests)
    drafted = collect(engines(family, **kw), requests)
    for (_, a), (streamed, b) in zip(plain, drafted, strict=True):
        assert ids(b) == ids(a) and streamed == ids(b)
        assert (b.generated_text, b.finish_reason) == (a.generated_text, a.finish_reason)
    return [c for _, c in drafted]


def test_engine_verifies_the_heads_guesses_after_the_last_token(engines, medusa, tiny_checkpoints):
    engine = engines()
    assert engine.speculate == 3 and isinstance(engine.proposer, MedusaProposer)
    engine.proposer = recording = Recording()
    requests = [greedy(20, prompt_ids=prompt(s, 4 + 3 * s)) for s in range(3)]
    same_as_plain(engines, requests)
    engine.proposer = MedusaProposer()
    assert len(recording.seen) >= 10
    for context, drafts in recording.seen:  # heads at the token before the last one
        hidden, lm_head = torch_hidden(tiny_checkpoints("llama"), context[:-1])
        want = reference_drafts(medusa(), hidden[-1:], lm_head)[0]
        assert list(drafts) == list(want[: len(drafts)])


@pytest.mark.parametrize("family", testing.SPECULATION_FAMILIES)
def test_every_family_gives_the_same_ids(engines, family):
    requests = [greedy(14, prompt_ids=prompt(3, 11)), greedy(10, prompt_ids=prompt(4, 5) * 3)]
    same_as_plain(engines, requests, family)


def repeating_prompt(engines) -> tuple[int, ...]:
    """A prompt whose greedy answer repeats a token several times (the tiny model falls into
    loops on a repeated token): "the next token again" heads then guess right."""
    plain = engines(speculate=0)
    for token in range(3, VOCAB, 7):
        p = (token,) * 9
        ((_, c),) = collect(plain, [greedy(24, prompt_ids=p)])
        if sum(a == b for a, b in zip(ids(c), ids(c)[1:], strict=False)) >= 8:
            return p
    raise AssertionError("no prompt with a repeating answer")


@pytest.mark.parametrize("speculate", [1, 3])
def test_right_guesses_are_kept(engines, speculate):
    p = repeating_prompt(engines)
    (c,) = same_as_plain(engines, [greedy(24, prompt_ids=p)], copy=True, speculate=speculate)
    repeats = sum(a == b for a, b in zip(ids(c), ids(c)[1:], strict=False))
    assert 0 < c.skipped_tokens <= repeats  # each kept guess is a repeat of the last token


def test_mixed_batch_with_stops_eos_max_new_grammar_and_sampling(engines):
    p = repeating_prompt(engines)
    plain = engines(speculate=0)
    ((_, full),) = collect(plain, [greedy(24, prompt_ids=p)])
    stop = plain.tokenizer.decode(ids(full)[10:12])
    grammar = plain.grammar_compiler.compile(GrammarSpec.regex(r"(ab|cd)[a-z]{3,9}-[0-9]{2,6}"))
    requests = [
        GenerationRequest(prompt_ids=p, max_new_tokens=24, stop=(stop,)),
        greedy(3, prompt_ids=p),
        greedy(20, prompt_ids=prompt(21, 6), grammar=grammar),
        GenerationRequest(
            prompt_ids=p,
            max_new_tokens=16,
            sampling=SamplingParams(do_sample=True, seed=7, repetition_penalty=1.1),
            top_n_tokens=2,
        ),
    ]
    drafted = same_as_plain(engines, requests, copy=True)
    assert drafted[0].finish_reason == "stop_sequence" and len(drafted[1].tokens) == 3
    eos_id = ids(full)[12]  # the 13th token becomes an EOS for this pair of engines
    e_plain = engines(speculate=0, extra_eos_ids=(eos_id,))
    e_medusa = engines(copy=True, extra_eos_ids=(eos_id,))
    ((_, a),) = collect(e_plain, [greedy(24, prompt_ids=p)])
    ((_, b),) = collect(e_medusa, [greedy(24, prompt_ids=p)])
    assert ids(a) == ids(b) and a.finish_reason == b.finish_reason == "eos_token"
