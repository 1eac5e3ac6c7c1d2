"""IncrementalDetokenizer: UTF-8 safety, equality with a full decode, TGI-like token texts."""

import random

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models

from tgix.engine.detokenizer import IncrementalDetokenizer
from tgix.models.hub import ModelFiles, default_model_file
from tgix.testing import write_test_tokenizer
from tgix.tokenizer import load_tokenizer

MULTILINGUAL = (
    "Hello 😀 world! 中文 日本語 한국어 🚀❤️ café e\u0301 n\u0303 👩‍👩‍👧 🇫🇷 ∑≈ Ω x\u0308\u0301.\n"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The 300-id byte-level BPE from tgix.testing (0..2 are special tokens)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    write_test_tokenizer(folder)
    return load_tokenizer(ModelFiles("safetensors", folder))


@pytest.fixture(scope="module")
def smollm2(pytestconfig, tmp_path_factory):
    """The default model's GPT-2-style tokenizer (49152 ids). Its GGUF conversion (~4 s) is
    cached in .pytest_cache, not the home folder, so only the first run pays for it."""
    cache = getattr(pytestconfig, "cache", None)
    with pytest.MonkeyPatch.context() as patch:
        folder = cache.mkdir("tgix-cache") if cache else tmp_path_factory.mktemp("tgix-cache")
        patch.setenv("TGIX_CACHE", str(folder))
        return load_tokenizer(ModelFiles("gguf", default_model_file()))


def _gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is spelled with in the vocab."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


BYTE_CHARS = _gpt2_byte_chars()


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The UTF-8 bytes a byte-level BPE token stands for (special tokens: their content)."""
    if token_id in tokenizer.hf.all_special_ids:
        return tokenizer.hf.convert_ids_to_tokens(token_id).encode()
    return bytes(BYTE_CHARS[c] for c in tokenizer.hf.convert_ids_to_tokens(token_id))


def byte_token_ids(tokenizer) -> list[int]:
    """The 256 single-byte tokens, which can split any multi-byte character."""
    return [tokenizer.hf.convert_tokens_to_ids(c) for c in BYTE_CHARS]


_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def settled_text(data: bytes) -> str:
    """Decode `data` without a trailing unfinished character (what may be shown so far).

    Written out because Python's incremental decoder also holds back invalid tails such as
    b"\xed\xa6", which the tokenizers (Rust, Unicode's maximal-subpart rule) settle at once.
    """
    for size in (1, 2, 3):
        if size > len(data) or not 0x80 <= data[-size] <= 0xBF:
            break
    if size <= len(data):
        lead, rest = data[-size], data[len(data) - size + 1 :]
        needed = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4
        low, high = _SECOND_BYTE.get(lead, (0x80, 0xBF))
        valid_start = 0xC2 <= lead <= 0xF4 and (not rest or low <= rest[0] <= high)
        if valid_start and size < needed:
            data = data[:-size]
    return data.decode("utf-8", "replace")


def detokenize(tokenizer, ids, prompt_ids=()):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces = [detok.add(i) for i in ids]
    return pieces, detok.flush()


def check_utf8_safe(tokenizer, ids):
    """Every piece is the slice of the full decode at its place and never ends mid-character;
    the pieces plus the flush are exactly the full decode (special tokens kept)."""
    full = tokenizer.decode(ids)
    data = b"".join(token_bytes(tokenizer, i) for i in ids)
    assert data.decode("utf-8", "replace") == full  # the byte model above is the tokenizer's
    detok = IncrementalDetokenizer(tokenizer)
    emitted = ""
    for step, token_id in enumerate(ids):
        piece = detok.add(token_id)
        assert full[len(emitted) : len(emitted) + len(piece)] == piece, (ids, step)
        emitted += piece
        prefix = b"".join(token_bytes(tokenizer, i) for i in ids[: step + 1])
        assert settled_text(prefix).startswith(emitted), (ids, step)
    assert emitted + detok.flush() == full, ids


def test_random_ids_over_the_test_tokenizer_are_utf8_safe(tiny):
    rng = random.Random(1234)
    for _ in range(300):
        ids = [rng.randrange(tiny.vocab_size) for _ in range(rng.randint(1, 40))]
        check_utf8_safe(tiny, ids)


def test_multilingual_text_split_into_bytes_is_utf8_safe(smollm2):
    """Real ids of emoji/CJK/combining text, mixed with byte tokens that split characters."""
    rng = random.Random(99)
    text_ids = smollm2.encode(MULTILINGUAL, add_special_tokens=False)
    byte_ids = byte_token_ids(smollm2)
    assert smollm2.decode(text_ids) == MULTILINGUAL
    check_utf8_safe(smollm2, text_ids)
    for _ in range(300):
        start = rng.randrange(len(text_ids))
        ids = text_ids[start : start + rng.randint(1, 40)]
        for _ in range(rng.randint(0, 8)):  # splice in stray bytes and special tokens
            ids.insert(rng.randint(0, len(ids)), rng.choice(byte_ids + [0, 1, 2]))
        check_utf8_safe(smollm2, ids)
        prompt = text_ids[: rng.randrange(len(text_ids))]
        expected = smollm2.decode(prompt + ids)[len(smollm2.decode(prompt)) :]
        pieces, rest = detokenize(smollm2, ids, prompt)
        assert "".join(pieces) + rest == expected, (prompt, ids)


def test_emoji_split_over_tokens_gives_empty_texts_then_the_character(smollm2):
    ids = smollm2.encode(" 😀!", add_special_tokens=False)
    assert len(ids) == 3  # " \xf0\x9f\x98", "\x80", "!"
    pieces, rest = detokenize(smollm2, ids)
    assert pieces == ["", " 😀", "!"] and rest == ""


def test_sequence_ending_mid_character_flushes_a_replacement_char(smollm2):
    ids = smollm2.encode(" 😀", add_special_tokens=False)[:1]
    pieces, rest = detokenize(smollm2, ids)
    assert pieces == [""]
    assert rest == " \ufffd" == smollm2.decode(ids)


def test_pieces_keep_leading_spaces_and_special_tokens(smollm2):
    prompt = smollm2.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = smollm2.encode("Hello there, how are you?", add_special_tokens=False) + [2]
    pieces, rest = detokenize(smollm2, ids, prompt)
    assert pieces == ["Hello", " there", ",", " how", " are", " you", "?", "<|im_end|>"]
    assert rest == ""


def test_prompt_context_does_not_change_byte_level_pieces(smollm2):
    prompt = smollm2.encode("Tell me about 中文 😀")
    ids = smollm2.encode(" Sure: 中文 is Chinese 🚀.", add_special_tokens=False)
    with_prompt = detokenize(smollm2, ids, prompt)
    assert with_prompt == detokenize(smollm2, ids)
    assert "".join(with_prompt[0]) == " Sure: 中文 is Chinese 🚀."


class _SentencePieceLike:
    """A Llama-2-style decoder (▁ for spaces, <0xNN> byte fallback, first space stripped)."""

    VOCAB = ["<unk>", "▁Hello", "▁world", "!", "<0xE4>", "<0xB8>", "<0xAD>", "▁"]

    def __init__(self):
        vocab = {token: i for i, token in enumerate(self.VOCAB)}
        self.raw = RawTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        self.raw.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )

    def decode(self, ids, skip_special_tokens=False):
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)


def test_prompt_context_gives_the_first_token_its_leading_space():
    """SentencePiece drops the first token's leading space; the prompt tail restores it."""
    sp = _SentencePieceLike()
    hello, world, bang, e4, b8, ad, space = 1, 2, 3, 4, 5, 6, 7
    assert sp.decode([world]) == "world" and sp.decode([hello, world]) == "Hello world"
    assert detokenize(sp, [world, bang]) == (["world", "!"], "")
    pieces, rest = detokenize(sp, [world, space, e4, b8, ad, bang], prompt_ids=[hello])
    assert pieces == [" world", " ", "", "", "中", "!"] and rest == ""


def test_sentencepiece_pieces_match_a_full_decode_after_any_prompt():
    """Valid UTF-8 only: with byte fallback an invalid byte run decodes as all U+FFFD."""
    sp = _SentencePieceLike()
    units = [[1], [2], [3], [7], [4, 5, 6]]  # words, "!", a lone space, "中" as 3 byte tokens
    rng = random.Random(5)
    for _ in range(200):
        prompt = [i for _ in range(rng.randint(0, 3)) for i in rng.choice(units)]
        ids = [i for _ in range(rng.randint(1, 8)) for i in rng.choice(units)]
        pieces, rest = detokenize(sp, ids, prompt)
        assert "".join(pieces) + rest == sp.decode(prompt + ids)[len(sp.decode(prompt)) :]
        assert "\ufffd" not in "".join(pieces) + rest


def test_replacement_chars_in_the_text_are_released_without_waiting(smollm2):
    """A run of real U+FFFDs is not held forever: the window, so the cost, stays bounded."""
    calls = []

    class Recording:
        def decode(self, ids, skip_special_tokens=False):
            calls.append(len(ids))
            return smollm2.decode(ids, skip_special_tokens)

    replacement = smollm2.encode("\ufffd\ufffd", add_special_tokens=False)
    ids = smollm2.encode("It says:", add_special_tokens=False) + replacement * 200
    detok = IncrementalDetokenizer(Recording(), prompt_ids=list(range(100, 200)))
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == smollm2.decode(ids)
    assert max(calls) <= 12
    assert "".join(pieces[:-10]).count("\ufffd") > 300  # streamed as it comes, not at the end


def test_window_stays_small_over_a_long_sequence(smollm2):
    calls = []

    class Recording:
        def decode(self, ids, skip_special_tokens=False):
            calls.append(len(ids))
            return smollm2.decode(ids, skip_special_tokens)

    ids = smollm2.encode(MULTILINGUAL * 40, add_special_tokens=False)
    pieces, rest = detokenize(Recording(), ids)
    assert "".join(pieces) + rest == MULTILINGUAL * 40
    assert len(calls) <= 3 * len(ids) + 1 and max(calls) <= 8
