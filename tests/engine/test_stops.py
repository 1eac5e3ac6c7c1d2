"""StopBuffer: hold-back of possible stop text, exact cuts, earliest match, release on mismatch.

Tokens come from the real test tokenizer: text is encoded, and the ids go through the
IncrementalDetokenizer, as in the engine.
"""

import random

import pytest

from tgix.engine.detokenizer import IncrementalDetokenizer
from tgix.engine.request import TokenInfo
from tgix.engine.stops import StopBuffer
from tgix.models.hub import ModelFiles
from tgix.testing import write_test_tokenizer
from tgix.tokenizer import load_tokenizer

FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    write_test_tokenizer(folder)
    return load_tokenizer(ModelFiles("safetensors", folder))


def token_infos(tokenizer, text: str) -> list[TokenInfo]:
    """`text` as the engine's generated tokens: ids, incremental texts, made-up logprobs."""
    detok = IncrementalDetokenizer(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [TokenInfo(i, detok.add(i), -0.5 * n, False) for n, i in enumerate(ids)]


def run(tokens, stops):
    """Push every token (stopping at a match) -> (buffer, what each push released)."""
    buffer = StopBuffer(stops)
    releases = []
    for token in tokens:
        releases.append(buffer.push(token))
        if buffer.matched:
            break
    else:
        releases.append(buffer.flush())
    return buffer, releases


def streamed_text(releases) -> str:
    return "".join(t.text for batch in releases for t in batch)


def tokens_spanned(tokens, text_start: int, text_end: int) -> int:
    """How many tokens' texts overlap text[text_start:text_end]."""
    count, position = 0, 0
    for token in tokens:
        if position < text_end and position + len(token.text) > text_start:
            count += 1
        position += len(token.text)
    return count


@pytest.mark.parametrize(
    ("stop", "spans"),
    [(" the", 1), ("r", 1), ("he ", 2), ("ov", 2), (" fox", 3), ("k br", 4)],
)
def test_stop_is_cut_exactly_after_its_last_character(tokenizer, stop, spans):
    tokens = token_infos(tokenizer, FOX)
    assert "".join(t.text for t in tokens) == FOX
    end = FOX.index(stop) + len(stop)
    assert tokens_spanned(tokens, FOX.index(stop), end) == spans
    buffer, releases = run(tokens, [stop])
    assert buffer.matched == stop
    assert streamed_text(releases) == buffer.text == FOX[:end]
    released = [t for batch in releases for t in batch]
    assert released[:-1] == tokens[: len(released) - 1]  # untouched, in order
    last, original = released[-1], tokens[len(released) - 1]
    assert (last.id, last.logprob, last.special) == (original.id, original.logprob, False)
    assert original.text.startswith(last.text) and last.text


def test_stop_ending_mid_token_cuts_that_tokens_text(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    assert [t.text for t in tokens[23:25]] == ["o", "ver"]
    buffer, releases = run(tokens, ["ove"])
    assert releases[-1][-1] == TokenInfo(tokens[24].id, "ve", tokens[24].logprob, False)
    assert buffer.text.endswith(" ove")


def test_possible_stop_text_is_held_then_released_when_it_does_not_match(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    texts = [t.text for t in tokens]
    buffer, releases = run(tokens, [" lazy cat"])
    assert buffer.matched is None
    for index, text in enumerate(texts[:-1]):
        if text in (" l", "a", "z", "y"):  # " lazy" could still become " lazy cat"
            assert tokens[index] not in releases[index], text
    held_start = texts.index(" l")
    assert releases[held_start + 4] == tokens[held_start : held_start + 5]  # " d": no match
    assert streamed_text(releases) == buffer.text == FOX


def test_nothing_is_held_without_stop_sequences(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    buffer = StopBuffer([])
    assert all(buffer.push(t) == [t] for t in tokens)
    assert buffer.flush() == [] and buffer.text == FOX and buffer.matched is None


def test_earliest_match_in_the_text_wins_whatever_the_list_order(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    buffer, _ = run(tokens, ["dog", "over", "fox"])
    assert buffer.matched == "fox" and buffer.text == "The quick brown fox"


def test_stop_that_extends_another_never_fires(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    buffer, _ = run(tokens, ["brown fox", "brown"])
    assert buffer.matched == "brown" and buffer.text == "The quick brown"


def test_stops_ending_at_the_same_character_report_the_longer(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    buffer, _ = run(tokens, ["x", "fox"])
    assert buffer.matched == "fox" and buffer.text == "The quick brown fox"


def test_stop_made_of_a_character_split_over_byte_tokens(tokenizer):
    text = "Caf\u00e9 \U0001f600 and more"
    tokens = token_infos(tokenizer, text)
    assert "" in [t.text for t in tokens]  # the emoji's first bytes have no text yet
    buffer, releases = run(tokens, ["\U0001f600"])
    assert buffer.matched == "\U0001f600"
    assert streamed_text(releases) == buffer.text == "Caf\u00e9 \U0001f600"


def test_special_token_text_can_be_a_stop(tokenizer):
    tokens = token_infos(tokenizer, "Hi")
    tokens.append(TokenInfo(2, "<|im_end|>", -0.1, True))
    buffer, releases = run(tokens, ["<|im_end|>"])
    assert buffer.matched == "<|im_end|>" and releases[-1][-1].special


def test_push_after_a_match_is_refused_and_empty_stops_are_ignored(tokenizer):
    tokens = token_infos(tokenizer, FOX)
    buffer, _ = run(tokens, ["", "quick"])
    assert buffer.stop_sequences == ("quick",) and buffer.matched == "quick"
    with pytest.raises(RuntimeError):
        buffer.push(tokens[-1])


def test_random_texts_and_stops_never_stream_stop_text(tokenizer):
    """Random stops cut from the corpus: streamed text never goes past a match's start before
    the match, matches are the earliest, and without a match everything comes out."""
    rng = random.Random(7)
    corpus = [
        FOX,
        "Hello, world! How are you today? I am fine, thank you.",
        "Once upon a time there was a little engine that could.",
        "Caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600 \U0001f680 r\u00e9sum\u00e9 \u00fcber.",
    ]
    for _ in range(200):
        text = rng.choice(corpus)
        stops = []
        for _ in range(rng.randint(1, 4)):
            start = rng.randrange(len(text))
            stops.append(text[start : start + rng.randint(1, 8)])
        stops.append("never in the corpus")
        tokens = token_infos(tokenizer, text)
        buffer, releases = run(tokens, stops)
        final = buffer.text
        assert streamed_text(releases) == final
        ends = [text.find(s) + len(s) for s in stops if s in text]
        if not ends:
            assert buffer.matched is None and final == text
            continue
        assert len(final) == min(ends) and final.endswith(buffer.matched), (text, stops)
        before_match = streamed_text(releases[:-1])
        assert len(before_match) <= len(final) - len(buffer.matched), (text, stops)


def test_held_text_stays_bounded_on_long_streams(tokenizer):
    tokens = token_infos(tokenizer, FOX) * 200
    buffer = StopBuffer(["lazy cat", "\n\n", "the end"])
    most_held = 0
    for token in tokens:
        buffer.push(token)
        most_held = max(most_held, len(buffer.held))
    assert most_held <= len("lazy cat")
    buffer.flush()
    assert not buffer.held and buffer.matched is None and buffer.text == FOX * 200
