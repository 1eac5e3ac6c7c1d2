"""Token bytes as the model emits them: GPT-2 byte-level and SentencePiece byte-fallback
alphabets, special tokens excluded, padding past the tokenizer, the default model's vocab."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tgix import testing
from tgix.grammar.vocabulary import TokenVocabulary


def sentencepiece_tokenizer():
    pieces = ["<unk>", "<s>", "</s>", "▁hello", "▁", "hello", "<0xE2>", "<0x82>", "<0xAC>"]
    pieces += ["▁w", "o", "rld", "é"]
    model = models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True)
    tok = Tokenizer(model)
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_sentencepiece_spaces_and_byte_fallback():
    v = TokenVocabulary.from_tokenizer(sentencepiece_tokenizer())
    assert v.token_bytes[:3] == (None, None, None)  # unk, bos, eos are special
    assert v.token_bytes[3:9] == (b" hello", b" ", b"hello", b"\xe2", b"\x82", b"\xac")
    assert v.token_bytes[12] == "é".encode()
    assert v.eos_ids == (2,)


@pytest.fixture(scope="module")
def test_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    testing.write_test_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


def test_byte_level_bytes_concatenate_to_the_decoded_text(test_tokenizer):
    v = TokenVocabulary.from_tokenizer(test_tokenizer)
    rng = random.Random(0)
    texts = ["hello world", 'emoji 😀 and "quotes"', "日本語 ünïcödé\n\ttabs", '{"a": [1, 2]}']
    for text in texts + ["".join(rng.choices('aé€😀 \n{}"', k=20)) for _ in range(20)]:
        ids = test_tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(v.token_bytes[i] for i in ids) == text.encode()
    for special in test_tokenizer.all_special_ids:
        assert v.token_bytes[special] is None


def test_logit_width_padding_and_truncation(test_tokenizer):
    n = len(test_tokenizer)
    wide = TokenVocabulary.from_tokenizer(test_tokenizer, size=n + 7, eos_ids=(0,))
    assert wide.size == n + 7 and wide.token_bytes[n:] == (None,) * 7
    narrow = TokenVocabulary.from_tokenizer(test_tokenizer, size=n - 5, eos_ids=(0,))
    assert len(narrow.token_bytes) == n - 5  # ids the model cannot produce are dropped
    assert wide.digest() != narrow.digest()
    with pytest.raises(ValueError, match="EOS id"):
        TokenVocabulary.from_tokenizer(test_tokenizer, eos_ids=(n + 100,))
