"""Where a compute role runs and in which precision: shared by the trainer and the engines.

A role given GPUs computes on the first GPU it sees: Ray sets ``CUDA_VISIBLE_DEVICES`` for
each actor to the GPUs it assigned, and a process started by hand honours the variable the
same way, so ``cuda:0`` is always the role's own. Mixed precision is ``torch.autocast``
around the model's forward over weights kept in their own dtype (fp32 master weights
with bf16 compute, as veRL's ``fsdp_config.mixed_precision`` means it); on CPU the same
code runs under CPU autocast, which is how it is tested without a GPU. The matmuls' weights
are cast once, not at every call: ``compute_weights.py`` keeps their copies in the compute
dtype until the masters change, and swaps them in for each pass.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, ContextManager, Dict, Iterator, Optional

import torch

from trinity.utils.compute_weights import ComputeWeights, applies

# veRL writes fp32 / bf16 / fp16, Hugging Face float32 / bfloat16 / float16: both are taken.
DTYPES: Dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def cpu_supports(dtype: str) -> bool:
    """Whether oneDNN (torch's CPU kernels) has instructions for ``dtype`` (``bfloat16``,
    ``float16``) on this CPU; without them torch emulates it, about 100x slower than fp32."""
    name = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}
    try:
        return bool(getattr(torch.ops.mkldnn, name[dtype])())
    except (AttributeError, RuntimeError):  # a build without oneDNN: nothing to say
        return True


def role_device(use_gpu: bool) -> torch.device:
    """The device a role computes on: its first visible GPU when it was given GPUs, else
    the CPU. Raises when GPUs were asked for and this torch sees none."""
    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "this role was given GPUs (cluster.gpu_per_node > 0) but torch sees none: install "
            "torch's CUDA build and check CUDA_VISIBLE_DEVICES, or set cluster.gpu_per_node: 0"
        )
    return torch.device("cuda", torch.cuda.current_device())


def compute_in(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its forward run under autocast to ``dtype`` (its weights untouched);
    fp32 leaves it as it is. Every caller of the forward (trainer passes, the critic, the
    shared-prefix scorer) then computes in ``dtype``, with no argument threaded through.
    Where ``compute_weights.applies``, the passes read ``dtype`` copies of the linear
    weights made once per change of the masters (same numbers as autocast's own casts);
    elsewhere (sharded parameters) plain autocast casts at each call."""
    if dtype == torch.float32:
        return model
    device_type = next(model.parameters()).device.type
    forward = model.forward
    weights = ComputeWeights(model, dtype) if applies(model, dtype) else None
    setattr(model, _COMPUTE_WEIGHTS, weights)

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with _swapped(compute_weights(model)), torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = autocast_forward
    setattr(model, _COMPUTE_DTYPE, dtype)
    return model


_COMPUTE_DTYPE = "_trinity_compute_dtype"  # set by compute_in on the model it wraps
_COMPUTE_WEIGHTS = "_trinity_compute_weights"  # its ComputeWeights, or None: plain autocast


def _swapped(weights: Optional[ComputeWeights]) -> ContextManager:
    return weights.swapped() if weights is not None else contextlib.nullcontext()


def compute_dtype(model: torch.nn.Module) -> Optional[torch.dtype]:
    """The dtype ``compute_in`` made ``model``'s forward compute in; None: its own."""
    return getattr(model, _COMPUTE_DTYPE, None)


def compute_weights(model: torch.nn.Module) -> Optional[ComputeWeights]:
    """The cached compute-dtype weights ``compute_in`` gave ``model``; None: none."""
    return getattr(model, _COMPUTE_WEIGHTS, None)


def plain_autocast(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` computing under autocast's per-call casts, its cached weights dropped: the
    side the cache is compared against (tests, ``bench/train_step_floor.py``)."""
    setattr(model, _COMPUTE_WEIGHTS, None)
    return model


@contextlib.contextmanager
def compute_context(model: torch.nn.Module) -> Iterator[None]:
    """The autocast ``compute_in`` runs ``model``'s forward under, with its cached weights
    swapped in, for calls that skip that forward and run a submodule directly (the decoder
    and the output head separately); a no-op context where ``model`` computes in its own
    dtype."""
    dtype = compute_dtype(model)
    if dtype is None:
        yield
        return
    with _swapped(compute_weights(model)):
        with torch.autocast(next(model.parameters()).device.type, dtype=dtype):
            yield


def attention_kwargs(device: torch.device) -> Dict[str, Any]:
    """``from_pretrained`` arguments for ``device``: PyTorch's SDPA kernels on CUDA (flash /
    memory-efficient attention); transformers' own choice elsewhere."""
    return {"attn_implementation": "sdpa"} if device.type == "cuda" else {}


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory torch allocated on ``device`` since the last reset, in GB (0 on CPU)."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(device) / 1e9
