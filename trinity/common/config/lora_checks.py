"""Checks of ``model.lora_configs``: what a LoRA run cannot do, and its folders and targets.

``lora_problems`` needs only the config (``validate.check_consistency`` calls it);
``lora_folder_problems`` reads the model and adapter folders (the preflight calls it, before
Ray starts); ``lora_handover_problems`` is about a stage that a later stage starts from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any, List, Sequence

from trinity.utils.model_files import ADAPTER_WEIGHTS, missing_parts

KEY = "model.lora_configs"


def lora_problems(config: Any) -> List[str]:
    """Combinations a LoRA run cannot do, one line each."""
    entries = config.model.lora_configs or []
    if len(entries) > 1:
        return [f"{KEY} has {len(entries)} entries, but only one adapter is supported: keep one"]
    return []


def lora_handover_problems(stage: Any) -> List[str]:
    """A LoRA stage that a later stage starts from must export a whole (merged) model."""
    entries = stage.model.lora_configs or []
    if not entries or entries[0].save_merged:
        return []
    return [
        f"{KEY}[0].save_merged = false, but the next stage starts from this stage's final HF "
        "checkpoint, which then holds only the adapter; set save_merged: true"
    ]


def lora_folder_problems(config: Any, model_from_previous: bool) -> List[str]:
    """peft is installed, the adapter folder (``path``) is one, and the targets exist as
    Linear layers of the model (read on the meta device: no weights are loaded)."""
    entries = config.model.lora_configs or []
    if not entries:
        return []
    if importlib.util.find_spec("peft") is None:
        return [f"{KEY} needs the peft package, which is not installed: pip install peft"]
    entry, key = entries[0], f"{KEY}[0]"
    problems: List[str] = []
    targets = entry.target_modules
    if entry.path:
        adapter, problems = _adapter_folder(entry, key)
        if adapter is None:
            return problems
        targets = adapter.get("target_modules", targets)
    model_path = config.model.model_path
    if model_from_previous or not os.path.isfile(os.path.join(model_path, "config.json")):
        return problems  # the model folder's own check says what is wrong with it
    return problems + _target_problems(f"{key}.target_modules", targets, model_path)


def _adapter_folder(entry: Any, key: str) -> tuple:
    """(adapter_config.json, problems) of ``entry.path``; None when it is not an adapter."""
    path = entry.path
    if not os.path.isdir(path):
        return None, [
            f"{key}.path = {path}: no such folder {os.path.abspath(path)} (a peft adapter "
            "folder, or a hub id of one, is expected)"
        ]
    config_file = os.path.join(path, "adapter_config.json")
    if missing_parts(path, "adapter"):
        return None, [
            f"{key}.path = {path}: not a peft adapter folder (adapter_config.json and "
            f"{' or '.join(ADAPTER_WEIGHTS)} expected)"
        ]
    try:
        with open(config_file, encoding="utf-8") as f:
            adapter = json.load(f)
    except (OSError, ValueError) as exc:
        return None, [f"{config_file} cannot be read as JSON: {exc}"]
    if adapter.get("peft_type") != "LORA":
        return None, [f"{key}.path = {path}: a {adapter.get('peft_type')} adapter, not LoRA"]
    problems = []
    for field, theirs in (("lora_rank", "r"), ("lora_alpha", "lora_alpha")):
        if field in entry.model_fields_set and getattr(entry, field) != adapter.get(theirs):
            problems.append(
                f"{key}.{field} = {getattr(entry, field)}, but the adapter at {path} has "
                f"{theirs} = {adapter.get(theirs)}; remove {field} (the adapter's own wins)"
            )
    return adapter, problems


def _linear_modules(model_path: str) -> tuple:
    """(names of Linear layers, names of other modules, name of the output layer when it
    shares the input embeddings' weight) of the model, built on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear, other, tied = [], [], None
    output = model.get_output_embeddings() if config.get_text_config().tie_word_embeddings else None
    for name, module in model.named_modules():
        (linear if isinstance(module, torch.nn.Linear) else other).append(name)
        tied = name if module is output else tied
    return linear, other, tied


def _target_problems(key: str, targets: Any, model_path: str) -> List[str]:
    """Each named target matches a Linear layer (peft's rule: the module path or its end)."""
    try:
        linear, other, tied = _linear_modules(model_path)
    except Exception as exc:  # the model folder's own check reports an unreadable config
        return [f"{key}: cannot list the layers of {model_path}: {exc}"]
    leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
    if targets == "all-linear":  # peft leaves the output layer out
        return []
    if isinstance(targets, str):  # peft reads one string as a regex over module paths
        if tied and re.fullmatch(targets, tied):
            return [_tied_problem(key, targets)]
        if any(re.fullmatch(targets, name) for name in linear):
            return []
        return [
            f"{key} = {targets} matches no Linear layer of {model_path} (a string is a regular "
            f"expression over module paths); Linear layers are named {', '.join(leaves)}"
        ]
    if not isinstance(targets, Sequence) or not targets:
        return [f"{key} must be all-linear, a list of layer names or a regular expression"]
    problems = []
    for target in targets:
        if tied and _matches(target, [tied]):
            problems.append(_tied_problem(key, target))
        elif not _matches(target, linear):
            what = "is not a Linear layer" if _matches(target, other) else "names no layer"
            problems.append(
                f"{key}: '{target}' {what} of {model_path}; LoRA adapts Linear layers, here "
                f"named {', '.join(leaves)}"
            )
    return problems


def _tied_problem(key: str, target: str) -> str:
    return (
        f"{key}: '{target}' takes in the output layer, which shares its weight with the input "
        "embeddings (tie_word_embeddings), so merged weights would change both; leave it out"
    )


def _matches(target: str, names: Sequence[str]) -> bool:
    return any(n == target or n.endswith("." + target) for n in names)
