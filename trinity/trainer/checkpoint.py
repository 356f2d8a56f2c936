"""Checkpoints in ``<job_dir>/global_step_N/`` and veRL's ``latest_checkpointed_iteration.txt``.

A checkpoint holds ``actor/model.safetensors`` (weights; with LoRA only the adapter's
tensors), ``actor/optim.pt`` (optimizer and lr scheduler), ``<name>.pt`` for further states
(e.g. ``critic.pt``), ``extra.json`` (step, a random checkpoint id, sample-strategy state)
and, when asked, ``hf/`` (a folder ``AutoModelForCausalLM.from_pretrained`` loads, written by
the trainer). A trainer of several ranks
(``trainer.cpu_ranks``) also writes ``actor/shards/`` (its model and optimizer, one file per
rank, by ``torch.distributed.checkpoint``); its ``model.safetensors`` holds the gathered
whole weights and ``optim.pt`` the lr scheduler.

Durability: a checkpoint is written into ``global_step_N.tmp-<pid>``, every file fsynced,
then renamed to ``global_step_N``; the "latest" marker is written last, by rename. A run
killed mid-save therefore resumes from the previous complete checkpoint, and the next save
removes the leftover temporary folder. A disk error while saving raises ``CheckpointError``
saying what happened, after removing the partial folder; the previous checkpoint and the
marker are untouched.

Safety: ``.pt`` files are read with ``torch.load(weights_only=True)`` (tensors and plain
data only), weights with safetensors, small state as JSON, so a crafted checkpoint cannot
run code when it is loaded.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import re
import shutil
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

from safetensors import SafetensorError

from trinity.common.weights import (
    LATEST_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    latest_step,
    load_weights,
    saved_steps,
    step_dir,
)

if TYPE_CHECKING:  # torch is imported where it is used: the job-folder helpers here
    import torch  # (latest_step, step_dir, ...) serve processes that never load it

OPTIM_FILE = os.path.join("actor", "optim.pt")
EXTRA_FILE = "extra.json"
# Written by several trainer ranks: the sharded model and optimizer (torch.distributed
# .checkpoint), and the rank count in extra.json (optim.pt then holds the lr scheduler only).
SHARDS_DIR = os.path.join("actor", "shards")
SHARDS_FILE = os.path.join(SHARDS_DIR, ".metadata")
RANKS_KEY = "trainer_ranks"
# In extra.json: a random id each checkpoint gets when written, so a checkpoint written again
# at the same step (a stage run over) differs from the one a later stage started from.
CHECKPOINT_ID_KEY = "checkpoint_id"
_LEFTOVER = re.compile(r"global_step_\d+\.(tmp|old)-\d+|" + re.escape(LATEST_FILE) + r"\.tmp")


# ---- writing files durably --------------------------------------------------------------


class _FdWriter(io.RawIOBase):
    """Writes everything it is given to ``fd`` or raises ``OSError``.

    ``torch.save`` to a path reports a full disk as "unexpected pos 10184128 vs 10184080";
    through this writer it surfaces as ``OSError(ENOSPC)``.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            written = os.write(self._fd, view)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        return total


def _fsync_path(path: str) -> None:
    """Flush a file's (or a folder's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_os_error(exc: SafetensorError) -> OSError:
    """The ``OSError`` behind a safetensors write error (its Rust writer reports I/O failures
    as text: "... No space left on device (os error 28)")."""
    found = re.search(r"os error (\d+)", str(exc))
    return OSError(int(found.group(1)) if found else errno.EIO, str(exc))


def fsync_tree(path: str) -> None:
    """fsync every file and folder under ``path`` (so a rename after it publishes data)."""
    for root, _, files in os.walk(path):
        for name in files:
            _fsync_path(os.path.join(root, name))
        _fsync_path(root)


def write_whole(out_dir: str, write: Callable[[str], None], what: str, kept: str) -> None:
    """``write(folder)`` into ``<out_dir>.tmp``, fsynced, then renamed to ``out_dir``: the
    folder is whole or absent. A disk error raises ``CheckpointError`` naming ``what`` and
    ``kept`` (what is intact), with the partial folder removed."""
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            write(tmp)
        except SafetensorError as exc:  # how transformers' weight writer reports I/O
            raise as_os_error(exc) from exc
        fsync_tree(tmp)
        os.replace(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(disk_error_message(exc, what, out_dir, kept)) from exc


def _save_torch(obj: Any, path: str) -> None:
    import torch

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with io.BufferedWriter(_FdWriter(fd), buffer_size=1 << 20) as f:
            torch.save(obj, f)
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_json(obj: Any, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save_weights(
    state_dict: Dict[str, torch.Tensor], path: str, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Write a state dict as safetensors; tied weights are stored once and re-tied on load.

    safetensors refuses two names for one tensor (a causal LM's tied embeddings and
    ``lm_head``): the later name is kept in the file's metadata as an alias. ``metadata``:
    more entries of the file's metadata (a LoRA adapter's layout).
    """
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    first: Dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
        if t.numel() and key in first:
            aliases[name] = first[key]
            continue
        first[key] = name
        tensors[name] = t.contiguous()
    try:
        own = {"format": "pt", "aliases": json.dumps(aliases)}
        save_file(tensors, path, metadata={**(metadata or {}), **own})
    except SafetensorError as exc:
        raise as_os_error(exc) from exc
    _fsync_path(path)


# ---- saving a checkpoint ----------------------------------------------------------------


_DISK_ERRORS = {
    errno.ENOSPC: ("disk full", "free space and resume"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota and resume"),
    errno.EROFS: ("read-only file system", "make checkpoint_root_dir writable and resume"),
    errno.EACCES: ("permission denied", "make checkpoint_root_dir writable and resume"),
    errno.EPERM: ("permission denied", "make checkpoint_root_dir writable and resume"),
    errno.EIO: ("disk I/O error", "check the disk and resume"),
}


def disk_error_message(exc: OSError, what: str, path: str, kept: str) -> str:
    """One line: which disk error stopped writing ``what`` to ``path``, what to do, and
    what is still intact (``kept``)."""
    cause, advice = _DISK_ERRORS.get(
        exc.errno or 0, (exc.strerror or str(exc), "fix the file system and resume")
    )
    return f"{cause} while writing {what} to {path}: {advice}; {kept}"


def _remove_leftovers(job_dir: str) -> None:
    """Temporary folders and markers of a save that was killed before it finished."""
    for name in os.listdir(job_dir):
        if _LEFTOVER.fullmatch(name):
            path = os.path.join(job_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)


def _write_files(
    tmp: str,
    step: int,
    weights: Dict[str, torch.Tensor],
    optim_state: Dict[str, Any],
    extra: Dict[str, Any],
    states: Optional[Dict[str, Any]],
    metadata: Optional[Dict[str, str]],
) -> None:
    os.makedirs(os.path.join(tmp, "actor"), exist_ok=True)  # ranks may have written shards
    save_weights(weights, os.path.join(tmp, WEIGHTS_FILE), metadata)
    _save_torch(optim_state, os.path.join(tmp, OPTIM_FILE))
    for name, state in (states or {}).items():
        _save_torch(state, os.path.join(tmp, f"{name}.pt"))
    record = {"step": step, CHECKPOINT_ID_KEY: uuid.uuid4().hex, **extra}
    _save_json(record, os.path.join(tmp, EXTRA_FILE))
    _fsync_path(os.path.join(tmp, "actor"))
    _fsync_path(tmp)


def _install(tmp: str, out: str) -> None:
    """Rename the finished ``tmp`` folder to ``out``, replacing a stale ``out``."""
    old = None
    if os.path.exists(out):  # an unmarked folder of an earlier run past this step
        old = f"{out}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    _fsync_path(os.path.dirname(out))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_marker(job_dir: str, step: int) -> None:
    tmp = os.path.join(job_dir, LATEST_FILE + ".tmp")
    _save_json(step, tmp)
    os.replace(tmp, os.path.join(job_dir, LATEST_FILE))
    _fsync_path(job_dir)


def apply_retention(job_dir: str, step: int, max_to_keep: Optional[int]) -> List[int]:
    """Delete checkpoints older than ``step`` beyond the newest ``max_to_keep``; the deleted.

    ``step`` (just written) and the marker's step are always kept, whatever ``max_to_keep``
    says (None keeps everything). Folders of later steps are left for the run to overwrite.
    """
    if max_to_keep is None:
        return []
    protected = {step, latest_step(job_dir)}
    older = [s for s in saved_steps(job_dir) if s < step and s not in protected]
    keep_older = max(int(max_to_keep) - 1, 0)
    doomed = older[: max(len(older) - keep_older, 0)]
    for old in doomed:
        shutil.rmtree(step_dir(job_dir, old), ignore_errors=True)
    return doomed


def staging_dir(job_dir: str, step: int) -> str:
    """A fresh temporary folder for checkpoint ``step``, after removing what a killed save
    left behind; several trainer ranks write their shards into it before ``save_checkpoint``
    (``staged``) completes and installs it."""
    os.makedirs(job_dir, exist_ok=True)
    _remove_leftovers(job_dir)
    tmp = f"{step_dir(job_dir, step)}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    return tmp


def save_checkpoint(
    job_dir: str,
    step: int,
    model: Union[torch.nn.Module, Dict[str, torch.Tensor]],
    optim_state: Dict[str, Any],
    extra: Dict[str, Any],
    max_to_keep: Optional[int] = None,
    states: Optional[Dict[str, Any]] = None,
    staged: Optional[str] = None,
    weights_metadata: Optional[Dict[str, str]] = None,
) -> str:
    """Write checkpoint ``step`` whole, mark it the latest, keep the newest ``max_to_keep``.

    ``model`` is a module (its whole state dict is saved) or the state dict to save (a
    LoRA run's adapter tensors). ``optim_state`` and ``states`` (further named states,
    e.g. ``critic``, each saved as ``<name>.pt``) must hold only tensors and plain data,
    since they are loaded with ``weights_only=True``; ``extra`` must be JSON. Raises
    ``CheckpointError`` on a disk error, leaving the previous checkpoint and marker as they
    were. ``staged``: the ``staging_dir`` other files (sharded state) were written into.
    ``weights_metadata``: more metadata of the weights file (a LoRA adapter's layout).
    """
    if staged is None:
        os.makedirs(job_dir, exist_ok=True)
        _remove_leftovers(job_dir)
    previous = latest_step(job_dir)
    out = step_dir(job_dir, step)
    tmp = staged or f"{out}.tmp-{os.getpid()}"
    installed = False
    try:
        weights = model if isinstance(model, dict) else model.state_dict()
        _write_files(tmp, step, weights, optim_state, extra, states, weights_metadata)
        _install(tmp, out)
        installed = True
        _write_marker(job_dir, step)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if installed and latest_step(job_dir) != step:  # complete but never marked
            shutil.rmtree(out, ignore_errors=True)
        kept = (
            f"the previous checkpoint (step {previous}) is intact"
            if previous is not None
            else "no earlier checkpoint exists"
        )
        raise CheckpointError(
            disk_error_message(exc, f"checkpoint step {step}", out, kept)
        ) from exc
    apply_retention(job_dir, step, max_to_keep)
    return out


# ---- loading a checkpoint ---------------------------------------------------------------


def _load_torch(path: str) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data, which could run code "
            f"when loaded; refusing to load it (was it written by this trainer?): {exc}"
        ) from exc
    except (RuntimeError, EOFError) as exc:  # torch's zip reader on a truncated file
        raise CheckpointError(f"{path} is damaged (truncated or not a torch file): {exc}") from exc


def load_checkpoint(job_dir: str, step: int, ranks: int = 1) -> Dict[str, Any]:
    """``{"model", "optim", "extra", "states"}`` of checkpoint ``step``, for a trainer of
    ``ranks`` ranks; with several, ``model`` is None and the weights and optimizer are in
    the sharded state (``trinity/trainer/sharded_checkpoint.py``)."""
    src = step_dir(job_dir, step)
    required = (WEIGHTS_FILE, OPTIM_FILE, EXTRA_FILE) + ((SHARDS_FILE,) if ranks > 1 else ())
    missing = [f for f in required if not os.path.isfile(os.path.join(src, f))]
    if missing:
        raise CheckpointError(
            f"checkpoint {src} is incomplete: {', '.join(missing)} missing (damaged, or written "
            f"by an older version); point {os.path.join(job_dir, LATEST_FILE)} at a complete "
            "step or set continue_from_checkpoint: false to start over"
        )
    with open(os.path.join(src, EXTRA_FILE)) as f:
        extra = json.load(f)
    saved = int(extra.get(RANKS_KEY, 1))
    if (saved > 1) != (ranks > 1):  # shards reshard to any count above 1, never to one file
        fits = f"{saved}" if saved == 1 else f"{saved} (or any count above 1)"
        raise CheckpointError(
            f"checkpoint {src} was written by {saved} trainer rank(s) (trainer.cpu_ranks = "
            f"{saved}) and this run has {ranks}: resume with trainer.cpu_ranks: {fits}, or set "
            "continue_from_checkpoint: false to start over"
        )
    states = {
        name[: -len(".pt")]: _load_torch(os.path.join(src, name))
        for name in sorted(os.listdir(src))
        if name.endswith(".pt")
    }
    return {
        "states": states,
        "model": load_weights(os.path.join(src, WEIGHTS_FILE)) if ranks == 1 else None,
        "optim": _load_torch(os.path.join(src, OPTIM_FILE)),
        "extra": extra,
    }
