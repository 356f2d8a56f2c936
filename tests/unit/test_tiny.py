"""The tiny model family: exact char tokenizer, ChatML template, seeded offline HF folders."""

import os
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from trinity.demo.tiny import (
    TINY_PRESETS,
    _llama_config,
    build_char_tokenizer,
    build_tiny_model,
)

MICRO = TINY_PRESETS["micro"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"), **MICRO)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def test_char_tokenizer_round_trips_printable_text(tokenizer):
    text = string.printable.replace("\t", "").replace("\r", "").replace("\x0b", "")
    text = text.replace("\x0c", "") + "  two  spaces\n\nand lines "
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids_next_to_text(tokenizer):
    text = "<|im_start|>user\n12+7=<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    # <|im_start|> + "user\n12+7=" (10 chars) + <|im_end|>
    assert ids[0] == start and ids[-1] == end and len(ids) == 12
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n12+7="


def test_unknown_characters_map_to_unk(tokenizer):
    ids = tokenizer.encode("a\u00e9b", add_special_tokens=False)
    assert ids[1] == tokenizer.unk_token_id and len(ids) == 3


def test_chatml_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n1+1=<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template(messages, tokenize=False)
    assert plain == text[: -len("<|im_start|>assistant\n")]


def test_folder_loads_offline_as_tied_llama(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_same_seed_same_weights_and_rebuild_is_skipped(tmp_path, model_dir):
    weights = os.path.join(model_dir, "model.safetensors")
    stamp = os.path.getmtime(weights)
    assert build_tiny_model(model_dir, **MICRO) == model_dir
    assert os.path.getmtime(weights) == stamp  # idempotent: nothing rewritten

    copy = build_tiny_model(str(tmp_path / "copy"), **MICRO)
    other = build_tiny_model(str(tmp_path / "other"), **MICRO, seed=1)
    w0, w1, w2 = (
        AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (model_dir, copy, other)
    )
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not torch.equal(w0["model.embed_tokens.weight"], w2["model.embed_tokens.weight"])


def test_changed_args_rebuild_and_foreign_folders_are_refused(tmp_path):
    path = build_tiny_model(str(tmp_path / "m"), **MICRO)
    rebuilt = build_tiny_model(path, **{**MICRO, "num_layers": 1})
    assert AutoModelForCausalLM.from_pretrained(rebuilt).config.num_hidden_layers == 1

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("not ours")
    with pytest.raises(FileExistsError, match="not built by build_tiny_model"):
        build_tiny_model(str(foreign), **MICRO)


def test_preset_sizes():
    tokenizer = build_char_tokenizer()
    sizes = {}
    for name, preset in TINY_PRESETS.items():
        with torch.device("meta"):  # count parameters without allocating them
            model = LlamaForCausalLM(_llama_config(tokenizer, preset))
        sizes[name] = sum(p.numel() for p in model.parameters())
    # tiny: 4 layers x (4*256^2 attention + 3*256*512 MLP + 2*256 norms) + 100*256 tied
    # embedding + 256 final norm = 4 * (262_144 + 393_216 + 512) + 25_600 + 256 = 2_649_344
    assert sizes["tiny"] == 2_649_344
    assert 24e6 < sizes["25m"] < 27e6
