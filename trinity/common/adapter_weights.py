"""A LoRA adapter as weights travel: its tensors, where each adapted layer's pair sits, and
the merge ``W + scale * B @ A`` (docs/guides/lora.md).

The trainer saves peft's adapter tensors in a checkpoint (resume puts them back with peft).
The weights file's metadata (``LAYOUT_KEY``) says, for each adapted weight of the base
model, the names of its ``A`` and ``B`` tensors and its scale, so a reader without a peft
model (a rollout engine, which holds the base weights) can merge them. The trainer's
``memory`` sync merges with the same ``Adapter.merged``, so both syncs hand the engines the
same weights.

torch is imported where it is used: ``read_sync_weights`` serves processes that only read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, Tuple, Union

if TYPE_CHECKING:
    import torch

LAYOUT_KEY = "lora"  # metadata key of a LoRA checkpoint's weights file: the layout, as JSON
PEFT_ADAPTER = "default"  # peft's adapter name: save_pretrained writes it at the folder's root


@dataclass(frozen=True)
class AdaptedWeight:
    """One adapted weight: its ``A`` and ``B`` tensors' names, and how the update is made."""

    a: str
    b: str
    scale: float
    transpose: bool = False  # peft's fan_in_fan_out (GPT-2's Conv1D): W is stored (in, out)


def merged_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, transpose: bool = False
) -> torch.Tensor:
    """``W + scale * B @ A`` in ``weight``'s dtype (``(B @ A)^T`` for a transposed weight)."""
    import torch

    if not transpose and a.dtype == weight.dtype:
        # one fused op: the merge is most of a LoRA sync's cost
        return torch.addmm(weight, b, a, alpha=scale)
    delta = (b.float() @ a.float()) * scale  # an adapter in another dtype: merge in fp32
    return weight + (delta.T if transpose else delta).to(weight.dtype)


@dataclass
class Adapter:
    """A LoRA adapter's tensors (peft's saved names) and their layout."""

    tensors: Dict[str, torch.Tensor]
    layers: Dict[str, AdaptedWeight]  # base model weight name -> its pair
    dtype: str  # the base weights' dtype where the adapter trained: the merge is done in it

    @classmethod
    def from_layout(cls, tensors: Dict[str, torch.Tensor], layout: str, source: str) -> Adapter:
        """The adapter a weights file holds, from its ``LAYOUT_KEY`` metadata."""
        data = json.loads(layout)
        layers = {name: AdaptedWeight(**pair) for name, pair in data["layers"].items()}
        return cls(tensors, layers, data["dtype"]).checked(source)

    def checked(self, source: str) -> Adapter:
        """``self``, once every tensor its layout names is there (else ``ValueError``)."""
        names = (n for pair in self.layers.values() for n in (pair.a, pair.b))
        missing = sorted(n for n in names if n not in self.tensors)
        if missing:
            raise ValueError(
                f"{source}: its LoRA layout names {len(missing)} tensor(s) it lacks, e.g. "
                f"{missing[:2]}"
            )
        return self

    def layout(self) -> str:
        """The ``LAYOUT_KEY`` metadata that ``from_layout`` reads back."""
        layers = {name: pair.__dict__ for name, pair in self.layers.items()}
        return json.dumps({"dtype": self.dtype, "layers": layers})

    def merged(self, base: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The merged weight of every adapted layer, from ``base`` (at least those weights,
        cast to the adapter's base dtype first); the other weights do not change."""
        import torch

        dtype = getattr(torch, self.dtype)
        merged = {}
        for name, pair in self.layers.items():
            weight = base[name].to(dtype)
            a, b = self.tensors[pair.a].to(weight.device), self.tensors[pair.b].to(weight.device)
            merged[name] = merged_weight(weight, a, b, pair.scale, pair.transpose).detach()
        return merged


def _lora_layers(model: Any) -> Iterator[Tuple[str, Any]]:
    """(name under the base model, LoRA layer) of every adapted layer of a peft model."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and PEFT_ADAPTER in module.lora_A:
            yield name, module


def peft_adapter(model: Any) -> Adapter:
    """The adapter of a peft model (tensors as ``get_peft_model_state_dict`` names them);
    ``base_weights(model)`` are the weights it merges into."""
    from peft import get_peft_model_state_dict

    tensors = {
        name: tensor.detach()
        for name, tensor in get_peft_model_state_dict(model, adapter_name=PEFT_ADAPTER).items()
    }
    layers, dtype = {}, None
    for name, layer in _lora_layers(model):
        if layer.use_dora.get(PEFT_ADAPTER):
            raise ValueError(f"{name}: a DoRA adapter is not supported yet (LoRA only)")
        prefix = f"base_model.model.{name}"  # peft's saved name of the layer
        layers[f"{name}.weight"] = AdaptedWeight(
            f"{prefix}.lora_A.weight",
            f"{prefix}.lora_B.weight",
            float(layer.scaling[PEFT_ADAPTER]),
            bool(getattr(layer, "fan_in_fan_out", False)),
        )
        dtype = dtype or str(layer.get_base_layer().weight.dtype).removeprefix("torch.")
    return Adapter(tensors, layers, dtype or "float32").checked("the peft model")


def base_weights(model: Any) -> Dict[str, torch.Tensor]:
    """The base weights of a peft model's adapted layers, under the base model's names."""
    return {f"{name}.weight": layer.get_base_layer().weight for name, layer in _lora_layers(model)}


def read_sync_weights(path: str) -> Union[Dict[str, torch.Tensor], Adapter]:
    """A checkpoint's weights file as a sync delivers it: the state dict, or the ``Adapter``
    when the file holds a LoRA run's adapter."""
    from safetensors import safe_open

    from trinity.common.weights import load_weights

    tensors = load_weights(path)
    with safe_open(path, framework="pt") as f:
        layout = (f.metadata() or {}).get(LAYOUT_KEY)
    return tensors if layout is None else Adapter.from_layout(tensors, layout, path)
