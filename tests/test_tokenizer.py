"""Tokenizer loading, chat templates, the --tokenizer-config-path override, the GGUF cache."""

import json

import pytest

from tgix.models.hub import ModelFiles, default_model_file
from tgix.tokenizer import load_tokenizer

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    return load_tokenizer(ModelFiles("safetensors", tiny_checkpoints("llama")))


def test_round_trip_and_special_ids(tiny):
    text = "Hello, world! 123 é 中 😀"
    assert tiny.decode(tiny.encode(text)) == text
    assert tiny.eos_token_ids == (2,) and tiny.bos_token_id == 1
    assert tiny.vocab_size == 300


def test_chat_template_renders_chatml(tiny):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tiny.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tokenizer_config_path_overrides_template_and_eos(tiny_checkpoints, tmp_path):
    override = tmp_path / "tokenizer_config.json"
    override.write_text(
        json.dumps(
            {
                "chat_template": TEMPLATE,
                "eos_token": {"content": "<|endoftext|>"},
            }
        )
    )
    tok = load_tokenizer(
        ModelFiles("safetensors", tiny_checkpoints("llama")), tokenizer_config_path=override
    )
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == "[user] Hi\n"
    assert tok.eos_token_ids == (0,)


def test_eos_set_adds_generation_config_and_config_ids(tiny_checkpoints, tmp_path):
    """A chat model ends turns with ids beside the tokenizer's eos (Gemma's <end_of_turn>)."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoints("llama"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9999]}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 5}))
    tok = load_tokenizer(ModelFiles("safetensors", folder))
    assert tok.eos_token_ids == (2, 7, 5)  # the tokenizer's, then the files'; 9999 is not an id


def test_template_runs_sandboxed(tiny_checkpoints, tmp_path):
    override = tmp_path / "tokenizer_config.json"
    override.write_text(json.dumps({"chat_template": "{{ ''.__class__.__mro__ }}"}))
    tok = load_tokenizer(
        ModelFiles("safetensors", tiny_checkpoints("llama")), tokenizer_config_path=override
    )
    with pytest.raises(Exception, match="unsafe|access"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.slow
def test_gguf_tokenizer_is_converted_once_then_cached(monkeypatch, tmp_path):
    import transformers

    monkeypatch.setenv("TGIX_CACHE", str(tmp_path))
    files = ModelFiles("gguf", default_model_file())
    first = load_tokenizer(files)
    cached = list((tmp_path / "tokenizers").glob("*/tokenizer.json"))
    assert len(cached) == 1

    real = transformers.AutoTokenizer.from_pretrained

    def no_conversion(*args, **kwargs):
        assert "gguf_file" not in kwargs, "the second load must reuse the cached tokenizer.json"
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_conversion)
    second = load_tokenizer(files)
    text = "Hello there, général Kenobi! 😀"
    assert second.encode(text) == first.encode(text)
    assert second.chat_template == first.chat_template
