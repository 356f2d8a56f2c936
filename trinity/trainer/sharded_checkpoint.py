"""Checkpoints of a trainer of several ranks (``trainer.cpu_ranks``).

The model and optimizer are saved sharded by ``torch.distributed.checkpoint`` (DCP) into
``actor/shards/`` (a file per rank plus ``.metadata``): no rank ever holds the whole
optimizer state. Rank 0 also writes what a 1-rank checkpoint holds (``checkpoint.py``): the
gathered whole weights in ``actor/model.safetensors`` (for the ``checkpoint`` weight sync
and the HF export), the lr scheduler in ``optim.pt``, ``extra.json`` with the rank count.

Durability as for one rank: rank 0 makes the staging folder, every rank writes its shards
into it, then rank 0 adds its files, installs the folder by rename and moves the marker.
A failure on any rank fails every rank with the same ``CheckpointError``.

Safety: DCP reads its ``.metadata`` with ``pickle`` and non-tensor values with
``torch.load(weights_only=False)``; here the metadata is read by an unpickler that builds only
DCP's own metadata classes, and non-tensor values with ``weights_only=True``, so a crafted
checkpoint cannot run code, as for the 1-rank files.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
from typing import Any, Dict, Optional, Tuple

import torch

from trinity.trainer import checkpoint as ckpt
from trinity.trainer.distributed import RankGroup, full_state_dict

_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
)
_PATHS = {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata only: its classes, torch dtypes and sizes, paths."""

    def find_class(self, module: str, name: str) -> Any:
        found = None
        if module in _METADATA_MODULES:
            obj = super().find_class(module, name)
            found = obj if isinstance(obj, type) and obj.__module__ == module else None
        elif module == "torch":
            obj = getattr(torch, name, None)
            found = obj if isinstance(obj, torch.dtype) or obj is torch.Size else None
        elif (module, name) == ("torch.serialization", "_get_layout"):  # a name -> layout lookup
            found = super().find_class(module, name)
        elif module == "pathlib" and name in _PATHS:
            found = super().find_class(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of checkpoint metadata")
        return found


def _reader(path: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        """DCP's file reader, its metadata read by ``_MetadataUnpickler``."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(os.path.join(path, ".metadata"), "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(path)


def _planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.planner import ReadItem

    class SafePlanner(DefaultLoadPlanner):
        """DCP's default planner, reading non-tensor values as plain data only."""

        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            data = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], data)
            else:
                self.state_dict[read_item.dest_index.fqn] = data

    return SafePlanner()


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }


def _os_error(exc: BaseException) -> OSError:
    """The disk error behind a DCP failure (it wraps each rank's exception)."""
    if isinstance(exc, OSError):
        return exc
    for failure in (getattr(exc, "failures", None) or {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, OSError):
            return inner
    return OSError(errno.EIO, str(exc))


def _staging(job_dir: str, step: int) -> Dict[str, str]:
    """Rank 0's staging folder (``tmp``), or the disk error that prevented it (``error``)."""
    try:
        return {"tmp": ckpt.staging_dir(job_dir, step)}
    except OSError as exc:
        kept, out = _kept(ckpt.latest_step(job_dir)), ckpt.step_dir(job_dir, step)
        return {"error": ckpt.disk_error_message(exc, f"checkpoint step {step}", out, kept)}


def _kept(previous: Optional[int]) -> str:
    if previous is None:
        return "no earlier checkpoint exists"
    return f"the previous checkpoint (step {previous}) is intact"


def save_sharded(
    group: RankGroup,
    job_dir: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    optim_state: Dict[str, Any],
    extra: Dict[str, Any],
    max_to_keep: Optional[int] = None,
) -> None:
    """Write checkpoint ``step`` of a sharded trainer (collective: every rank calls it;
    ``optim_state`` and ``extra`` are rank 0's: the lr scheduler, the sample strategy)."""
    import torch.distributed.checkpoint as dcp

    weights = full_state_dict(model)
    state = _sharded_state(model, optimizer)
    staged = group.broadcast_json(_staging(job_dir, step) if group.is_main else None)
    if "error" in staged:
        raise ckpt.CheckpointError(staged["error"])
    tmp = staged["tmp"]
    shards = os.path.join(tmp, ckpt.SHARDS_DIR)
    error = None
    try:
        dcp.save(state, checkpoint_id=shards)
    except Exception as exc:  # noqa: BLE001 - DCP wraps a rank's failure in its own type
        error = _os_error(exc)
    failed = group.total(1.0 if error is not None else 0.0) > 0
    message = ""
    if group.is_main:
        extra = {**extra, ckpt.RANKS_KEY: group.world}
        message = _finish(
            job_dir, step, tmp, (weights, optim_state, extra), max_to_keep, error, failed
        )
    message = group.broadcast_json(message)
    if message:
        raise ckpt.CheckpointError(message)


def _finish(
    job_dir: str,
    step: int,
    tmp: str,
    files: Tuple[Dict[str, torch.Tensor], Dict[str, Any], Dict[str, Any]],
    max_to_keep: Optional[int],
    error: Optional[OSError],
    failed: bool,
) -> str:
    """Rank 0's part after the shards: its files, the install and the marker; or, when a
    rank failed, the cleanup. ``files``: weights, optimizer state, extra. The error
    message, or ""."""
    if failed:
        shutil.rmtree(tmp, ignore_errors=True)
        kept, out = _kept(ckpt.latest_step(job_dir)), ckpt.step_dir(job_dir, step)
        if error is None:  # another rank's disk error: its own log names it
            return (
                f"a trainer rank failed to write its shards of checkpoint step {step} to {out} "
                f"(see the trainer ranks' logs); {kept}"
            )
        return ckpt.disk_error_message(error, f"checkpoint step {step}", out, kept)
    try:
        ckpt.save_checkpoint(job_dir, step, *files, max_to_keep=max_to_keep, staged=tmp)
    except ckpt.CheckpointError as exc:
        return str(exc)
    return ""


def load_sharded(
    group: RankGroup,
    job_dir: str,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> Dict[str, Any]:
    """Load checkpoint ``step``'s shards into ``model`` and ``optimizer`` (collective); the
    rest as ``checkpoint.load_checkpoint`` returns it (``optim``: the lr scheduler)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    found = ckpt.load_checkpoint(job_dir, step, ranks=group.world)
    shards = os.path.join(ckpt.step_dir(job_dir, step), ckpt.SHARDS_DIR)
    state = _sharded_state(model, optimizer)
    try:
        dcp.load(state, storage_reader=_reader(shards), planner=_planner())
    except Exception as exc:  # noqa: BLE001 - DCP wraps a rank's failure in its own type
        raise ckpt.CheckpointError(
            f"{shards} is damaged or not written by this trainer ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}); point "
            f"{os.path.join(job_dir, ckpt.LATEST_FILE)} at a complete step or set "
            "continue_from_checkpoint: false to start over"
        ) from exc
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return found
