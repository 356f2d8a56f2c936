"""Experiences as bytes that hold data only: safetensors tensors plus JSON fields.

``encode_experience`` writes one safetensors blob. Every tensor-valued attribute of the
``Experience`` (``tokens``, ``logprobs``, ``action_mask``, ``advantages``, ``returns``, or
any other) is a safetensors tensor named after the attribute, bit-exact with its dtype
(bf16 and bool included). Every other attribute is JSON, in the blob's ``__metadata__``
under ``"fields"``, next to ``"format"``.

One safetensors blob rather than a length-prefixed JSON header of our own: its header is
already JSON with a free-form metadata map, it is parsed by the safetensors library with
bounds checks, and a stored row can be inspected with any safetensors tool.

``decode_experience`` parses that JSON and the raw tensor bytes; nothing in a blob can name
code to run, unlike the pickle rows this replaces. ``info`` and ``metrics`` must therefore be
JSON data: numbers, strings, bools, None, lists and dicts with string keys. numpy/torch
scalars become numbers and tensors/arrays inside them become (nested) lists; anything else
raises ``TypeError`` naming where it was found.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, Dict, Tuple

import numpy as np
import torch
from safetensors import SafetensorError, TensorSpec, serialize
from safetensors.torch import load as load_tensors

from trinity.common.experience import Experience

FORMAT = "trinity.experience/1"
_FIELDS = {f.name: f for f in dataclasses.fields(Experience)}
# Fields that must be tensors after decoding (None allowed for the optional ones).
_TENSOR_FIELDS = ("tokens", "logprobs", "action_mask", "advantages", "returns")
_PER_TOKEN = ("logprobs", "action_mask", "advantages", "returns")


def _json_value(value: Any, where: str) -> Any:
    """``value`` as JSON data, or ``TypeError`` naming ``where`` it was found."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):  # numpy scalar: np.float32(1.5), np.bool_(True), ...
        return value.item()
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()  # a 0-d tensor gives a number, others nested lists
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{where} has the key {key!r} ({type(key).__name__}); "
                    "JSON objects take string keys only: use str keys"
                )
            out[key] = _json_value(item, f"{where}[{key!r}]")
        return out
    raise TypeError(
        f"{where} holds a {type(value).__name__}; store numbers, strings, lists or dicts"
    )


def _split(exp: Experience) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """(tensor attributes, JSON-ready attributes) of ``exp``."""
    tensors: Dict[str, torch.Tensor] = {}
    fields: Dict[str, Any] = {}
    seen_storage = set()
    for name, value in vars(exp).items():
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            # safetensors refuses tensors that overlap in memory (e.g. returns is
            # advantages): give any tensor whose storage was already seen its own copy.
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen_storage and t.numel():
                t = t.clone()
            seen_storage.add(t.untyped_storage().data_ptr())
            tensors[name] = t
        else:
            fields[name] = _json_value(value, f"Experience.{name}")
    return tensors, fields


def encode_experience(exp: Experience) -> bytes:
    """The bytes of every attribute of ``exp``; ``decode_experience`` inverts it exactly."""
    tensors, fields = _split(exp)
    header = {"format": FORMAT, "fields": json.dumps(fields, allow_nan=True)}
    # The bytes ``safetensors.torch.save`` writes, from the tensors' own memory: its torch
    # wrapper goes through numpy and ctypes per tensor, 42 us for an experience's three
    # against 4 us here (the explorer encodes every experience of a step on its way to the
    # trainer). ``tensors`` holds them alive, contiguous and on the CPU (``_split``), until
    # ``serialize`` has copied them.
    specs = {
        name: TensorSpec(
            dtype=str(t.dtype).split(".")[-1],
            shape=t.shape,
            data_ptr=t.data_ptr(),
            data_len=t.nbytes,
        )
        for name, t in tensors.items()
    }
    return serialize(specs, metadata=header)


def _metadata(data: bytes) -> Dict[str, str]:
    """The ``__metadata__`` map of a safetensors blob that ``load_tensors`` accepted."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    meta = header.get("__metadata__")
    return meta if isinstance(meta, dict) else {}


def _default(name: str) -> Any:
    f = _FIELDS[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _check(state: Dict[str, Any]) -> None:
    """Reject a decoded state that could not have come from a valid ``Experience``."""
    for name in _TENSOR_FIELDS:
        value = state.get(name)
        if value is not None and not isinstance(value, torch.Tensor):
            raise ValueError(f"Experience.{name} is {type(value).__name__}, expected a tensor")
    bad = [k for k in state if not k.isidentifier() or k.startswith("__")]
    if bad:
        raise ValueError(f"field names {bad} are not attribute names")
    tokens = state.get("tokens")
    if tokens is None or tokens.dtype.is_floating_point or tokens.dim() != 1:
        raise ValueError("the blob has no 1-d integer tokens tensor")
    if not isinstance(state.get("prompt_length"), int):
        raise ValueError("the blob has no integer prompt_length")
    n_resp = len(state["tokens"]) - state["prompt_length"]
    if n_resp < 0:
        raise ValueError(
            f"prompt_length {state['prompt_length']} exceeds {len(state['tokens'])} tokens"
        )
    for name in _PER_TOKEN:
        value = state.get(name)
        if value is not None and len(value) != n_resp:
            raise ValueError(f"Experience.{name} has {len(value)} entries, expected {n_resp}")
    for name in ("info", "metrics"):
        if not isinstance(state.get(name), dict):
            raise ValueError(f"Experience.{name} is not a JSON object")


def decode_experience(data: bytes) -> Experience:
    """The ``Experience`` that ``encode_experience`` wrote as ``data``.

    Raises ``ValueError`` for anything else (a pickle, a damaged row, another file's
    bytes); only JSON and raw tensor bytes are parsed, nothing is executed.
    """
    try:
        tensors = load_tensors(bytes(data))
        meta = _metadata(data)
    except (SafetensorError, ValueError, struct.error) as exc:
        raise ValueError(f"not an encoded Experience ({exc}); was it written by pickle?") from exc
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"not an encoded Experience: format {meta.get('format')!r}, expected {FORMAT!r}"
        )
    try:
        fields = json.loads(meta.get("fields", ""))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not an encoded Experience: its fields are not JSON ({exc})") from exc
    if not isinstance(fields, dict):
        raise ValueError("not an encoded Experience: its fields are not a JSON object")
    state = {**fields, **tensors}
    # Fields added to Experience after a row was written take their defaults.
    for name in _FIELDS:
        if name not in state:
            state[name] = _default(name)
    try:
        _check(state)
    except ValueError as exc:
        raise ValueError(f"not a valid encoded Experience: {exc}") from exc
    if state["action_mask"] is None:  # as Experience.__post_init__ fills it
        n_resp = len(state["tokens"]) - state["prompt_length"]
        state["action_mask"] = torch.ones(n_resp, dtype=torch.bool)
    # Bypass __init__/__post_init__: they would convert dtypes (bf16 logprobs to float32),
    # and the state is already what the encoded Experience held.
    exp = Experience.__new__(Experience)
    exp.__dict__.update(state)
    return exp
