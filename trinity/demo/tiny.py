"""A tiny, locally built model family for offline demos and tests (docs/design-notes.md,
"Principles": offline by construction).

``build_tiny_model`` writes an ordinary Hugging Face folder: a character-level tokenizer
(one token per printable ASCII character, plus ChatML special tokens) and a randomly
initialised Llama model. Any code that takes a ``model_path`` loads it unchanged with
``AutoTokenizer`` / ``AutoModelForCausalLM``, so nothing has to be downloaded.

The Llama architecture is deliberate: for ``model_type: qwen2`` folders ``AutoTokenizer``
substitutes Qwen's own tokenizer class, which would discard the character tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Dict

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, UNK_TOKEN]

# Printable ASCII (space .. tilde) plus newline: enough for arithmetic, countdown and chat.
CHARACTERS = [chr(c) for c in range(32, 127)] + ["\n"]

# ChatML; with ``tools`` (OpenAI function schemas) a system turn lists each as ``name(params)``
# (compact: a tiny model has 256 positions), and an assistant turn's ``tool_calls`` follow its
# content as Hermes/Qwen ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks.
CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>"
    "{%- for tool in tools %}{% set params = tool.function.parameters or {} %}"
    "{{ tool.function.name }}({{ (params.properties or {}) | list | join(',') }})"
    "{%- endfor %}</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "</tool_call>{%- endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_PRESETS: Dict[str, Dict[str, int]] = {
    # For unit tests of code that needs a real model: a forward pass takes well under 1 ms.
    "micro": dict(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        intermediate_size=128,
        max_position_embeddings=256,
    ),
    # micro with 2 heads of 32 dimensions (the smallest heads vLLM's CPU attention runs) and
    # a window for whole tool-call prompts of its character tokenizer.
    "micro32": dict(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        intermediate_size=128,
        max_position_embeddings=1024,
    ),
    # About 2.6M parameters: the default for quickstarts and integration tests.
    "tiny": dict(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        intermediate_size=512,
        max_position_embeddings=256,
    ),
    # About 25M parameters: 8 x (4*512^2 attention + 3*512*1408 MLP).
    "25m": dict(
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        intermediate_size=1408,
        max_position_embeddings=512,
    ),
}

_MARKER = "trinity_tiny_model.json"  # written last: its presence means the build completed


def build_char_tokenizer(max_length: int = 256, vocab_size: int = 0) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with ChatML special tokens and chat template.

    Every printable ASCII character and ``\\n`` is one token, so ``decode(encode(s)) == s``
    for such strings; characters outside that set map to ``<|unk|>``. ``vocab_size`` above
    the ~100 characters pads the vocabulary with ``<|reserved_i|>`` tokens that text never
    encodes to: a model of a real vocabulary's size (and lm_head cost) whose samples decode.
    """
    tokens = SPECIAL_TOKENS + CHARACTERS
    tokens += [f"<|reserved_{i}|>" for i in range(max(0, vocab_size - len(tokens)))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # "[\s\S]" matches every character, newline included; Fuse joins tokens without spaces.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHATML_TEMPLATE,
        model_max_length=max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _llama_config(tokenizer: PreTrainedTokenizerFast, args: Dict[str, Any]) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args["hidden_size"],
        num_hidden_layers=args["num_layers"],
        num_attention_heads=args["num_heads"],
        num_key_value_heads=args.get("num_kv_heads") or args["num_heads"],
        attention_bias=args.get("attention_bias", False),
        intermediate_size=args["intermediate_size"],
        max_position_embeddings=args["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _read_marker(out_dir: str) -> Dict[str, Any] | None:
    path = os.path.join(out_dir, _MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def build_tiny_model(
    out_dir: str,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 8,
    intermediate_size: int = 512,
    max_position_embeddings: int = 256,
    seed: int = 0,
    **shape: Any,
) -> str:
    """Build (or reuse) a character-level Llama model folder at ``out_dir``; return its path.

    ``shape`` takes what real checkpoints add: ``num_kv_heads`` (grouped-query attention),
    ``attention_bias`` (Qwen2's projection biases), ``vocab_size`` (a padded vocabulary,
    ``build_char_tokenizer``) and ``device`` (where the weights are initialised: a GPU
    makes a 0.5B model in a second). The weights depend only on the other arguments, so
    the same call gives the same model on any machine. If ``out_dir`` already holds a model
    built with the same arguments it is returned untouched. A non-empty ``out_dir`` that was
    not built here is never overwritten.
    """
    device = shape.pop("device", "cpu")
    unknown = set(shape) - {"num_kv_heads", "attention_bias", "vocab_size"}
    if unknown:
        raise TypeError(f"build_tiny_model got unknown argument(s) {sorted(unknown)}")
    args = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        **shape,
    )
    out_dir = os.path.abspath(out_dir)
    marker = _read_marker(out_dir)
    if marker == args:
        return out_dir
    if marker is None and os.path.isdir(out_dir) and os.listdir(out_dir):
        raise FileExistsError(
            f"{out_dir} is not empty and was not built by build_tiny_model; "
            "choose an empty or new directory"
        )
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")

    tokenizer = build_char_tokenizer(max_position_embeddings, shape.get("vocab_size", 0))
    config = _llama_config(tokenizer, args)
    devices = [torch.cuda.current_device()] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # seed the init, leave the caller's RNG
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id

    # Build next to the target and move files in, so a crash never leaves a folder that
    # looks complete; the marker goes in last.
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".tiny-build-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.makedirs(out_dir, exist_ok=True)
        stale = os.path.join(out_dir, _MARKER)
        if os.path.exists(stale):
            os.remove(stale)
        for name in os.listdir(tmp):
            shutil.move(os.path.join(tmp, name), os.path.join(out_dir, name))
    with open(os.path.join(out_dir, _MARKER), "w") as f:
        json.dump(args, f, indent=2)
    return out_dir


def build_tiny_preset(out_dir: str, preset: str = "tiny", seed: int = 0) -> str:
    """``build_tiny_model`` with one of ``TINY_PRESETS`` ("micro", "micro32", "tiny", "25m")."""
    if preset not in TINY_PRESETS:
        raise KeyError(f"unknown tiny preset '{preset}'; choose one of {sorted(TINY_PRESETS)}")
    return build_tiny_model(out_dir, seed=seed, **TINY_PRESETS[preset])
