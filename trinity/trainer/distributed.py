"""Several trainer ranks (``trainer.cpu_ranks``): one process group, FSDP2, a shared batch.

Rank 0 is the trainer of a 1-rank run: it reads the buffer, logs, publishes and writes the
non-sharded checkpoint files. Every rank holds a shard of each model
(``torch.distributed.fsdp.fully_shard`` on each decoder layer, then the root). Per step,
rank 0 sends the sampled experiences to the others as codec bytes (no pickle); every rank
builds the same full batch and computes the same advantages, then trains on its own rows.

FSDP's collectives need every rank to run the same forward/backward calls, so the ranks
agree on a micro-batch count and a rank with fewer runs zero-weight passes over a row every
rank holds (``Lockstep``). The gradient equals the 1-rank full-batch gradient: micro-batch
shares use the whole batch's token/row count, and FSDP's averaging over ranks is turned off
(gradients are summed).
"""

from __future__ import annotations

import heapq
import json
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from trinity.buffer.codec import decode_experience, encode_experience
from trinity.common.experience import Experience, ExperienceBatch


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RankGroup:
    """This process's place in the trainer's process group, and the collectives it uses."""

    rank: int
    world: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh over the ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _reduce(self, values: Sequence[float], op: Any) -> List[float]:
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=op)
        return tensor.tolist()

    def total(self, value: float) -> float:
        """Sum of ``value`` over the ranks."""
        return self._reduce([value], dist.ReduceOp.SUM)[0]

    def most(self, value: int) -> int:
        """Largest ``value`` of any rank."""
        return int(self._reduce([value], dist.ReduceOp.MAX)[0])

    def sum_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """Each of rank 0's metrics summed over the ranks; a rank that trained no row (it
        ran only zero-weight passes) has none and adds 0. Rank 0 always holds rows."""
        keys = self.broadcast_json(sorted(metrics) if self.is_main else None)
        values = self._reduce([metrics.get(k, 0.0) for k in keys], dist.ReduceOp.SUM)
        return dict(zip(keys, values, strict=True))

    def broadcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's ``data`` on every rank (the others' argument is ignored)."""
        size = torch.tensor([len(data) if self.is_main else 0], dtype=torch.int64)
        dist.broadcast(size, src=0)
        if self.is_main:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
        else:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        if int(size.item()):
            dist.broadcast(payload, src=0)
            return data if self.is_main else payload.numpy().tobytes()
        return b""

    def broadcast_json(self, value: Any) -> Any:
        """Rank 0's JSON-able ``value`` on every rank (plain data only, never pickle)."""
        text = json.dumps(value) if self.is_main else ""
        return json.loads(self.broadcast_bytes(text.encode()).decode())


def init_group(rank: int, world: int, port: int, timeout_s: float) -> RankGroup:
    """Join the trainer's gloo process group on 127.0.0.1:``port`` (rank 0 listens there).

    ``timeout_s`` bounds every collective: a rank that stops answering fails the others.
    """
    from torch.distributed.device_mesh import init_device_mesh

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    return RankGroup(rank, world, init_device_mesh("cpu", (world,)))


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _shard_units(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The repeated blocks to shard one by one: the classes a Hugging Face model lists in
    ``_no_split_modules`` (its decoder layers), searched through wrappers (a value model)."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in model.modules() if m is not model and type(m).__name__ in names]


def shard(model: torch.nn.Module, group: RankGroup) -> torch.nn.Module:
    """``fully_shard`` each decoder layer then the root, gradients summed over the ranks.

    FSDP averages gradients by default; the micro-batch shares already divide by the whole
    batch, so the average is undone (divide factor 1, a plain sum: gloo has no pre-scaled
    sum).
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for unit in _shard_units(model):
        fully_shard(unit, mesh=group.mesh)
    fully_shard(model, mesh=group.mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def full_state_dict(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The whole model's weights gathered on rank 0, on CPU (collective: every rank calls
    it; the other ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def as_number(value: Any) -> float:
    """A (possibly sharded) scalar tensor as a float: ``clip_grad_norm_`` over sharded
    parameters returns a distributed tensor of the global norm."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)


# ---- the batch ---------------------------------------------------------------------------


def split_rows(
    tokens: Sequence[int], world: int, balance: bool, multiple: int = 1
) -> List[List[int]]:
    """Each rank's rows of a batch whose rows hold ``tokens`` tokens each.

    ``balance`` (the algorithm's ``can_balance_batch``): rows go, largest first, to the rank
    with the fewest tokens so far (ties: fewer rows, then the lower rank). Otherwise
    contiguous runs of near-equal size. Units of ``multiple`` rows (preference pairs) are
    never split. Each rank's rows keep their batch order.
    """
    units = [
        list(range(i, min(i + multiple, len(tokens)))) for i in range(0, len(tokens), multiple)
    ]
    shares: List[List[int]] = [[] for _ in range(world)]
    if balance:
        heap = [(0, 0, rank) for rank in range(world)]
        by_size = sorted(units, key=lambda u: -sum(tokens[i] for i in u))  # stable
        for unit in by_size:
            load, rows, rank = heapq.heappop(heap)
            shares[rank] += unit
            heapq.heappush(heap, (load + sum(tokens[i] for i in unit), rows + len(unit), rank))
    else:
        base, extra = divmod(len(units), world)
        start = 0
        for rank in range(world):
            count = base + (1 if rank < extra else 0)
            shares[rank] = [i for unit in units[start : start + count] for i in unit]
            start += count
    return [sorted(share) for share in shares]


def broadcast_experiences(
    group: RankGroup, experiences: Optional[List[Experience]]
) -> Optional[List[Experience]]:
    """Rank 0's experiences on every rank, as codec bytes; None (rank 0 passed None) means
    the buffer is exhausted."""
    if group.is_main:
        blobs = [] if experiences is None else [encode_experience(e) for e in experiences]
        header = {"end": experiences is None, "sizes": [len(b) for b in blobs]}
    header = group.broadcast_json(header if group.is_main else None)
    payload = group.broadcast_bytes(b"".join(blobs) if group.is_main else b"")
    if header["end"]:
        return None
    if group.is_main:
        return experiences
    out, offset = [], 0
    for size in header["sizes"]:
        out.append(decode_experience(payload[offset : offset + size]))
        offset += size
    return out


def gather_rows(group: RankGroup, local: torch.Tensor, shares: List[List[int]]) -> torch.Tensor:
    """The whole batch's rows from every rank's ``local`` rows (``shares[r]`` are rank
    ``r``'s row numbers); collective."""
    most = max(len(s) for s in shares)
    padded = local.new_zeros((most, *local.shape[1:]))
    padded[: len(local)] = local
    parts = [torch.empty_like(padded) for _ in range(group.world)]
    dist.all_gather(parts, padded)
    out = local.new_zeros((sum(len(s) for s in shares), *local.shape[1:]))
    for part, rows in zip(parts, shares, strict=True):
        if rows:
            out[torch.tensor(rows)] = part[: len(rows)]
    return out


@dataclass
class Lockstep:
    """Keeps the ranks' forward/backward calls in step (``policy_step`` asks it).

    ``filler`` is a one-row batch every rank holds; a rank with fewer micro-batches than
    another runs it with zero weight, so each rank makes the same collective calls.
    """

    group: RankGroup
    filler: ExperienceBatch

    def total(self, value: float) -> float:
        """``value`` (this rank's tokens or rows) summed over the ranks."""
        return self.group.total(value)

    def pad(self, parts: List[ExperienceBatch]) -> List[Tuple[ExperienceBatch, bool]]:
        """(micro-batch, real) pairs: this rank's, then fillers up to the ranks' largest count."""
        count = self.group.most(len(parts))
        return [(p, True) for p in parts] + [(self.filler, False)] * (count - len(parts))
