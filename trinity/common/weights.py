"""Where a run's weights are and how they travel: the contract between the trainer, which
writes them, and the readers below it (engines, the synchronizer, bench mode, the checks).

- Checkpoint folders: ``<job_dir>/global_step_N/`` (``step_dir``), their weights file
  (``weights_path``), the "latest" marker (``latest_step``) and the complete ones
  (``complete_steps``). Writing them is ``trinity/trainer/checkpoint.py``'s job.
- The weights file: safetensors, tied names stored once (``load_weights`` re-ties them).
- ``memory`` sync: a state dict as numpy views for the Ray object store (``pack_state`` /
  ``unpack_state``).
- ``nccl`` sync: what the trainer publishes (``TransferOffer``); the transfer itself is
  ``weight_transfer.py``'s.
- Checksums (``tensor_stats``) that prove an engine holds the weights the trainer sent, and
  the errors of a sync that did not happen (``SyncTimeoutError``, ``WeightSyncError``).

Nothing here imports torch at module level: the job-folder helpers serve processes that
never load it (the synchronizer, the checks before start).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import numpy as np
    import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
WEIGHTS_FILE = os.path.join("actor", "model.safetensors")


# (sum of the values' bit patterns as integers, number of elements): see ``tensor_stats``
Stats = Tuple[int, int]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says why and what to do."""


class SyncTimeoutError(TimeoutError):
    """A side of a sync did not arrive within ``synchronizer.sync_timeout``."""


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights it was sent."""


@dataclass(frozen=True)
class TransferOffer:
    """Where the engines join the trainer's broadcast of its weights (``sync_method: nccl``):
    the store the trainer serves (``host``:``port``), the group's ``backend`` (``nccl`` or
    ``gloo``) and size (``world``: the trainer and every rollout engine), every wait's bound
    (``timeout``: ``synchronizer.sync_timeout``), and the receiving engine's ``rank``, set
    per engine by the explorer (``for_engine``)."""

    host: str
    port: int
    backend: str
    world: int
    timeout: float
    rank: int = 0

    def for_engine(self, index: int) -> TransferOffer:
        """The offer as rollout engine ``index`` takes it: rank ``index + 1``."""
        return replace(self, rank=index + 1)


def collective_backend(on_gpu: bool) -> str:
    """The ``torch.distributed`` backend of the ``nccl`` sync: NCCL between GPUs, gloo on
    CPU."""
    return "nccl" if on_gpu else "gloo"


def step_dir(job_dir: str, step: int) -> str:
    return os.path.join(job_dir, f"global_step_{step}")


def weights_path(job_dir: str, step: int) -> str:
    """The weights file of checkpoint ``step`` (what the ``checkpoint`` weight sync sends)."""
    return os.path.join(step_dir(job_dir, step), WEIGHTS_FILE)


def latest_step(job_dir: str) -> Optional[int]:
    """The step of the newest complete checkpoint, or None."""
    path = os.path.join(job_dir, LATEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    return int(text) if text.isdigit() else None


def saved_steps(job_dir: str) -> List[int]:
    if not os.path.isdir(job_dir):
        return []
    found = (re.fullmatch(r"global_step_(\d+)", d) for d in os.listdir(job_dir))
    return sorted(int(m.group(1)) for m in found if m)


def complete_steps(job_dir: str) -> List[int]:
    """Steps of the checkpoints in ``job_dir`` that hold their weights, ascending (a
    ``global_step_N`` folder exists only once complete: it is renamed into place)."""
    return [s for s in saved_steps(job_dir) if os.path.isfile(weights_path(job_dir, s))]


def load_weights(path: str) -> Dict[str, torch.Tensor]:
    """The state dict ``save_weights`` wrote to ``path`` (tied names point at one tensor)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        tensors = load_file(path, device="cpu")
        with safe_open(path, framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    except (SafetensorError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors weights file: {exc}") from exc
    for name, target in aliases.items():
        tensors[name] = tensors[target]
    return tensors


def tensor_stats(tensor: torch.Tensor) -> Stats:
    """``Stats`` of a tensor's values as stored (no dtype conversion before the sums): exact,
    so compared for equality, and blind to order, so a fused parameter holds its parts' sums
    added up and a kernel's reordering changes nothing."""
    import numpy as np
    import torch

    values = tensor.detach().contiguous().reshape(-1)
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = values.view(as_int[values.element_size()])
    if bits.device.type == "cpu":  # numpy's integer sum is about 10x faster than torch's here
        return int(bits.numpy().sum(dtype=np.int64)), values.numel()
    return int(bits.sum(dtype=torch.int64)), values.numel()


def pack_state(state_dict: Dict[str, torch.Tensor]) -> Dict[str, Tuple[np.ndarray, str]]:
    """Weights as numpy views for the object store (``memory`` sync).

    Ray stores numpy arrays without pickling and hands them back as zero-copy views, where
    torch tensors are pickled and copied on both sides (measured: seconds vs milliseconds
    at 100M parameters). ``ray.put`` copies the views once, so later optimizer steps do not
    leak into a published version. bf16 travels bit-for-bit as int16.
    """
    import torch

    packed = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        packed[name] = (raw.numpy(), str(t.dtype).removeprefix("torch."))
    return packed


def unpack_state(packed: Dict[str, Tuple[np.ndarray, str]]) -> Dict[str, torch.Tensor]:
    """Tensors over the arrays of ``pack_state`` (no copy; ``load_state_dict`` copies)."""
    import torch

    out = {}
    with warnings.catch_warnings():  # object-store arrays are read-only; we only read them
        warnings.simplefilter("ignore", UserWarning)
        for name, (array, dtype) in packed.items():
            tensor = torch.from_numpy(array)
            out[name] = tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
    return out
