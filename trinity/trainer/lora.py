"""LoRA through ``peft`` (``model.lora_configs``): wrap, score the base, merge, save, export.

The trainer wraps its model with one adapter (peft's ``default``, so an export loads with
``PeftModel.from_pretrained(base, hf_dir)`` without a subfolder). Only the adapter trains;
checkpoints hold only its tensors (peft's names, e.g. ``base_model.model.model.layers.0
.self_attn.q_proj.lora_A.weight``). The rollout engines sample with *merged* weights: at
each ``memory`` sync the trainer sends ``W + scale * B @ A`` of every adapted layer under the
base model's names, and nothing else, since the other weights never change; at each
``checkpoint`` sync the engines merge the checkpoint's adapter over their base weights the
same way (``trinity/common/adapter_weights.py``). The reference model
(KL) is the same module with the adapter switched off.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from trinity.common.adapter_weights import LAYOUT_KEY, PEFT_ADAPTER, base_weights, peft_adapter

logger = logging.getLogger(__name__)

MERGED_DIR = "merged"  # hf/merged: the whole merged model, when save_merged asks

# model.lora_configs[0].lora_dtype -> the adapter parameters' dtype ("auto": the model's)
LORA_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft model (the trainer's model when LoRA is configured)."""
    if "peft" not in sys.modules:  # then no model is one; importing peft costs 0.1 s
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _lora_config(entry: Any) -> Any:
    from peft import LoraConfig

    targets = entry.target_modules
    return LoraConfig(
        r=entry.lora_rank,
        lora_alpha=entry.lora_alpha,
        target_modules=list(targets) if isinstance(targets, (list, tuple)) else targets,
        lora_dropout=0.0,  # rollout and training logprobs must agree token for token
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: torch.nn.Module, entry: Any, base_model_name: str) -> torch.nn.Module:
    """``model`` with the adapter of ``entry`` (a ``LoRAConfig``); only the adapter trains.

    ``entry.path`` set: start from that peft adapter folder (its own rank, alpha and
    targets); else a fresh adapter (B = 0, so the wrapped model computes the base model's
    outputs). ``base_model_name`` is recorded in the adapter's exported config.
    """
    from peft import PeftModel, get_peft_model

    if entry.path:
        # autocast off: the adapter's dtype is lora_dtype's business, set below
        wrapped = PeftModel.from_pretrained(
            model, entry.path, is_trainable=True, autocast_adapter_dtype=False
        )
    else:
        wrapped = get_peft_model(model, _lora_config(entry), autocast_adapter_dtype=False)
    wrapped.peft_config[PEFT_ADAPTER].base_model_name_or_path = base_model_name
    dtype = next(model.parameters()).dtype
    if entry.lora_dtype != "auto":
        dtype = LORA_DTYPES[entry.lora_dtype]
    for param in wrapped.parameters():
        if param.requires_grad:
            param.data = param.data.to(dtype)
    trainable, total = wrapped.get_nb_trainable_parameters()
    logger.info(
        "LoRA adapter '%s' (%s): %d of %d parameters train",
        entry.name or PEFT_ADAPTER,
        entry.path or f"new, rank {entry.lora_rank}, alpha {entry.lora_alpha}",
        trainable,
        total,
    )
    return wrapped


def trainable_parameters(model: torch.nn.Module) -> list:
    """The parameters an optimizer should hold (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The base model for scoring (the KL reference): adapter off, eval mode, no autograd."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter(), torch.no_grad():
            yield model
    finally:
        model.train(was_training)


# ---- weights ---------------------------------------------------------------------------


def adapter_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (what a checkpoint holds)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=PEFT_ADAPTER)
    return {name: tensor.detach() for name, tensor in state.items()}


def load_adapter_state(model: torch.nn.Module, state: Dict[str, torch.Tensor], source: str) -> None:
    """Put checkpointed adapter tensors back onto ``model`` (the base stays as loaded).

    Raises ``ValueError`` naming ``source`` when the tensors are not this adapter's.
    """
    from peft import set_peft_model_state_dict

    expected = set(adapter_state_dict(model))
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"{source} does not hold this run's LoRA adapter (missing {len(missing)} tensors, "
            f"e.g. {missing[:2]}; unexpected {len(unexpected)}, e.g. {unexpected[:2]}): was "
            "model.lora_configs different when it was written? Resume with the same "
            "model.lora_configs, or set continue_from_checkpoint: false to start over"
        )
    set_peft_model_state_dict(model, state, adapter_name=PEFT_ADAPTER)


def merged_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``W + scale * B @ A`` of every adapted layer, under the base model's weight names.

    Only adapted layers: the rest of a LoRA model never changes, so an engine that loaded
    the base model needs just these (``load_state_dict`` takes a subset). An engine merges
    a checkpoint's adapter with the same ``Adapter.merged`` (``checkpoint`` sync).
    """
    with torch.no_grad():
        return peft_adapter(model).merged(base_weights(model))


def checkpoint_weights(model: torch.nn.Module) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """What a LoRA checkpoint's weights file holds: the adapter's tensors (peft's saved
    names, what resume reads back) and the metadata an engine merges them by."""
    adapter = peft_adapter(model)
    return adapter.tensors, {LAYOUT_KEY: adapter.layout()}


def sync_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """What a weight sync sends the engines: merged adapted layers (LoRA) or every weight."""
    return merged_state_dict(model) if is_lora(model) else model.state_dict()


# ---- export ----------------------------------------------------------------------------


def export_adapter(model: torch.nn.Module, out_dir: str) -> None:
    """Write the adapter in peft's format: ``adapter_config.json`` and
    ``adapter_model.safetensors`` at the root of ``out_dir``."""
    model.save_pretrained(out_dir, selected_adapters=[PEFT_ADAPTER], safe_serialization=True)


def export_merged(model: torch.nn.Module, base_path: str, out_dir: str) -> None:
    """Write a full model folder of the merged weights (base from ``base_path``)."""
    from transformers import AutoModelForCausalLM

    dtype = model.get_base_model().dtype
    merged = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    current = merged.state_dict()
    with torch.no_grad():
        for name, tensor in merged_state_dict(model).items():
            current[name].copy_(tensor)
    merged.save_pretrained(out_dir)


def adapter_folder_config(path: str) -> Optional[Dict[str, Any]]:
    """``adapter_config.json`` of a peft adapter folder, or None if it has none."""
    config = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        return json.load(f)
