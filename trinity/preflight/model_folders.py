"""Whether a local folder is a model, a tokenizer or a chat template that transformers
reads: checked before start, so that a folder that is not one is a line naming its key, not
a stack trace from inside transformers after the roles started."""

from __future__ import annotations

import json
import os
from typing import List, Optional

from trinity.utils.model_files import missing_parts, weight_file_problems

# What a missing folder could have been instead: the other form a model key takes.
OR_AN_ID = "give a local folder, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"


def model_folder_problems(key: str, path: str) -> List[str]:
    """Whether ``path`` is a local HF model folder: config.json, tokenizer and whole weights
    (every shard its index lists, no truncated safetensors file)."""
    if not os.path.exists(path):
        return [f"{key} = {path}: no such folder {os.path.abspath(path)} ({OR_AN_ID})"]
    if not os.path.isdir(path):
        return [f"{key} = {path}: not a folder (expected a Hugging Face model folder)"]
    missing = missing_parts(path, "model")
    if missing:
        return [f"{key} = {path}: not a model folder, it has no {', no '.join(missing)}"]
    broken = weight_file_problems(path)
    if broken:
        return [f"{key} = {path}: {broken[0]}; copy or download the model again"]
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # any reason transformers cannot read it ends the run later
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [f"{key} = {path}: config.json cannot be read by transformers: {reason}"]
    return []


def tokenizer_folder_problems(key: str, path: str) -> List[str]:
    """Whether ``path`` is a local folder holding a tokenizer (no weights needed)."""
    if not os.path.isdir(path):
        return [f"{key} = {path}: no such folder {os.path.abspath(path)} ({OR_AN_ID})"]
    return [f"{key} = {path}: no {part}" for part in missing_parts(path, "tokenizer")]


def chat_template_of(model_dir: str) -> Optional[str]:
    """The chat template the tokenizer in ``model_dir`` ships (the default of several) or None."""
    jinja = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read()
    for name, key in (
        ("chat_template.json", "chat_template"),
        ("tokenizer_config.json", "chat_template"),
    ):
        try:
            with open(os.path.join(model_dir, name), encoding="utf-8") as f:
                template = json.load(f).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(template, list):  # named templates: the default one
            template = next(
                (t.get("template") for t in template if t.get("name") == "default"), None
            )
        if template:
            return template
    return None


# A conversation every chat template must render: the turns workflows and SFT data send.
_PROBE_CHAT = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
    {"role": "user", "content": "u"},
]


def template_render_problem(template: str) -> Optional[str]:
    """Why ``template`` cannot render a system/user/assistant/user conversation with a
    generation prompt (None when it can), rendered as transformers renders it."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        render_jinja_template(
            conversations=[_PROBE_CHAT], chat_template=template, add_generation_prompt=True
        )
    except TemplateError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
