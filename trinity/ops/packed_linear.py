"""Linear layers through oneDNN on CPU: the engine's weights packed once, the trainer's fp32.

``F.linear`` on CPU hands each call a weight in its plain layout: for bf16 oneDNN reorders
it into its blocked layout at every call, and fp32 goes to MKL's GEMM, which on the AMD EPYC
machines this project is measured on runs at about 40% of oneDNN's speed. ``pack_linears``
gives each ``nn.Linear`` of an inference model a copy of its weight in oneDNN's layout, made
once (``mkldnn._reorder_linear_weight``) and multiplied by ``mkldnn._linear_pointwise``: the
two ops torch's own compiler uses for the linears of a frozen CPU graph. SmolLM2-135M's 30
layers and head, 2 threads: bf16 16.5 -> 10.6 ms a decode step at 1 row, 35.6 -> 32.0 at
64, the same bits; fp32 113.5 -> 46.3 ms at 64 rows (docs/performance.md, "Packed linear weights").

A layer packs its weight again at its first call after the weight changed: in place (every
``copy_``, as a weight sync or an adapter merge writes, bumps the tensor's version counter)
or for new memory (weights released and allocated again). A write through ``.data`` bumps
no counter: code that changes a packed model's weights writes them in place. The cost is a
second copy of the linear weights, kept while the model is packed (``forget`` drops it).
A call that autograd must see, that these ops do not take (another dtype or device), or
whose weight is an inference tensor (made under ``torch.inference_mode``: no version counter)
runs ``F.linear`` as before.

``route_linears`` is the trainer's side: its weights change at every optimizer step and its
calls need gradients, so nothing is packed; each fp32 call outside autocast runs
``_Linear``, whose forward and input gradient are oneDNN matmuls (it reorders the weight
itself, which for fp32 costs less than MKL's slow path) and whose weight gradient stays
torch's GEMM (oneDNN would first need both operands transposed in memory). Under autocast
(bf16 compute) a call stays ``F.linear``: oneDNN runs it already.

On Intel CPUs MKL's fp32 GEMM takes its fast path (``MKL_FP32``): there the trainer is not
routed, and the engine keeps fp32 weights of at most ``PLAIN_FP32_NUMEL`` elements plain
(concatenated where ``llama_forward`` fuses them) for ``F.linear``, with no copy to make
when the weights change. The quickstart's GRPO step on a 2-core Xeon: 274 -> 236-241 ms
(7092b4c; docs/performance.md, "MKL on Intel CPUs").
"""

from __future__ import annotations

import types
from typing import Any, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["Packed", "available", "forget", "pack_linears", "pointwise", "route_linears"]

_DTYPES = (torch.float32, torch.bfloat16)


def available(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU can pack weights of ``dtype``."""
    if dtype not in _DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        ops = torch.ops.mkldnn
        ops._linear_pointwise, ops._reorder_linear_weight  # noqa: B018 (present in this build)
        return dtype != torch.bfloat16 or bool(ops._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``, ...); empty where unknown."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# MKL's fp32 GEMM, which ``F.linear`` runs on CPU, takes its fast path on Intel CPUs only.
# There, timed on a 2-core Xeon (docs/performance.md, "MKL on Intel CPUs"), it matches
# oneDNN at the trainer's shapes and beats it on small matrices (about 10 us less a call),
# so the trainer is not routed and the engine packs only larger fp32 matrices.
MKL_FP32 = _vendor() == "GenuineIntel"
# On such a CPU, fp32 weights of at most this many elements stay plain for MKL: oneDNN's
# packed call was 0.9-1.0x MKL's at 64 rows up to 1024 x 256 and 1.02-1.3x from 576 x 576 up.
PLAIN_FP32_NUMEL = 1 << 18


def _reordered(weight: torch.Tensor) -> bool:
    """Whether ``weight`` (N, K) is multiplied by oneDNN from its packed layout (else
    ``F.linear`` reads it plain; see ``MKL_FP32``)."""
    return not (MKL_FP32 and weight.dtype == torch.float32 and weight.numel() <= PLAIN_FP32_NUMEL)


class Packed:
    """The packed copy of one weight, or of several concatenated along their outputs (with
    their biases, when they have them), what it was made from, and the multiply it takes:
    oneDNN's from the packed layout, or ``F.linear`` where the weight stays plain."""

    def __init__(self) -> None:
        self.weight: Optional[torch.Tensor] = None
        self.bias: Optional[torch.Tensor] = None
        self.source: tuple = ()  # (data_ptr, version) of each tensor it was made from
        self.reordered = True  # the weight is in oneDNN's layout (else plain)

    def linear(
        self,
        x: torch.Tensor,
        weights: Sequence[torch.Tensor],
        biases: Sequence[Optional[torch.Tensor]],
    ) -> torch.Tensor:
        """``x @ cat(weights).T + cat(biases)`` from the packed copy; shapes as ``of``."""
        weight, bias = self.of(weights, biases)
        if self.reordered:
            return pointwise(x, weight, bias)
        return F.linear(x, weight, bias)

    def of(
        self, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]]
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(packed weight, bias) of ``weights`` (N_i, K) and their ``biases`` (N_i,)."""
        tensors = [t for t in (*weights, *biases) if t is not None]
        if any(t.is_inference() for t in tensors):  # no version counter: packed at every call
            made_from: tuple = ()
        else:
            made_from = tuple((t.data_ptr(), t._version) for t in tensors)
        if self.weight is None or not made_from or self.source != made_from:
            weight = (weights[0] if len(weights) == 1 else torch.cat(weights)).detach()
            self.reordered = _reordered(weight)
            self.weight = weight
            if self.reordered:
                self.weight = torch.ops.mkldnn._reorder_linear_weight(weight)
            self.bias = None
            if any(b is not None for b in biases):
                self.bias = biases[0] if len(biases) == 1 else torch.cat(biases).detach()
            self.source = made_from
        return self.weight, self.bias

    def clear(self) -> None:
        self.weight = self.bias = None
        self.source = ()


def pointwise(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``x @ weight.T + bias`` by oneDNN; ``weight`` plain or packed. The op reads its input as
    contiguous whatever its strides, so it gets a contiguous one."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    packed = (
        x.dtype == weight.dtype
        and x.device.type == weight.device.type == "cpu"
        and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
        and not weight.is_inference()  # no version counter: its writes could not be seen
    )
    if not packed:
        return F.linear(x, weight, self.bias)
    return self._trinity_packed.linear(x, (weight,), (self.bias,))


def pack_linears(model: torch.nn.Module) -> int:
    """Route every plain ``nn.Linear`` of ``model`` whose weight is on CPU in a dtype this
    machine packs through its packed weight; returns how many layers were routed."""
    count = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear or hasattr(module, "_trinity_packed"):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or not available(weight.dtype):
            continue
        module._trinity_packed = Packed()
        module.forward = types.MethodType(_packed_forward, module)
        count += 1
    return count


def forget(model: torch.nn.Module) -> None:
    """Drop the packed copies (their memory); each is made again at its next use."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, Packed):
                value.clear()


class _Linear(torch.autograd.Function):
    """``F.linear`` with the forward and the input's gradient computed by oneDNN.

    Shapes: x (..., K), weight (N, K), bias (N,) or None -> (..., N)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return pointwise(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])  # (M, N)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = pointwise(grad, weight.t().contiguous(), None)  # (..., K)
        if ctx.needs_input_grad[1]:
            grad_weight = rows.t().mm(x.reshape(-1, x.shape[-1]))  # (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(dim=0)
        return grad_x, grad_weight, grad_bias


def _routed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    routed = (
        x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and type(weight) in (torch.nn.Parameter, torch.Tensor)  # not a DTensor shard
        and not torch.is_autocast_enabled("cpu")
    )
    if not routed:
        return F.linear(x, weight, self.bias)
    return _Linear.apply(x, weight, self.bias)


def route_linears(model: torch.nn.Module) -> int:
    """Route every plain fp32 ``nn.Linear`` of a model that trains on CPU through ``_Linear``
    where oneDNN has fp32 (see the module docstring); returns how many layers were routed."""
    if not available(torch.float32) or MKL_FP32:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear or "forward" in vars(module):
            continue
        if module.weight.device.type != "cpu" or module.weight.dtype != torch.float32:
            continue
        module.forward = types.MethodType(_routed_forward, module)
        count += 1
    return count
