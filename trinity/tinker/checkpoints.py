"""Checkpoints: ``tinker://<model id>/<kind>/<name>`` paths as folders under the state dir.

``<state_dir>/runs/<model id>/<kind>/<name>/`` holds, written under a temporary name and
renamed when complete:

- ``adapter_model.safetensors`` and ``adapter_config.json``: the adapter in peft's format
  (``PeftModel.from_pretrained(base, folder)`` loads it outside this server too);
- ``optimizer.safetensors``: AdamW's moments (``weights`` checkpoints only: what
  ``save_state`` keeps and ``load_state_with_optimizer`` restores);
- ``tinker.json``: the base model, the LoRA settings, the optimizer's step counts, the
  user's metadata and the time.

``kind`` is ``weights`` (``save_state``: to resume training) or ``sampler_weights``
(``save_weights_for_sampler``: to sample from); both can be loaded and sampled from.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from safetensors.torch import load_file, save_file

from trinity.tinker.errors import TinkerError, bad_field

SCHEME = "tinker://"
KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,255}")
ADAPTER_FILE, CONFIG_FILE = "adapter_model.safetensors", "adapter_config.json"
OPTIMIZER_FILE, META_FILE = "optimizer.safetensors", "tinker.json"


@dataclass(frozen=True)
class CheckpointPath:
    run: str  # the training model's id
    kind: str  # weights | sampler_weights
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.run}/{self.kind}/{self.name}"


def check_name(name: str, field: str) -> str:
    """A checkpoint name as a request gives it: one safe folder name."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise bad_field(
            field,
            f"'{name}' is not a checkpoint name (letters, digits, '.', '_', '-'; at most 128, "
            "not starting with '.')",
        )
    return name


def parse(path: str, field: str) -> CheckpointPath:
    """``tinker://<model id>/<kind>/<name>``; a 400 naming ``field`` otherwise."""
    parts = path[len(SCHEME) :].split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or parts[1] not in KINDS or not _RUN.fullmatch(parts[0]):
        raise bad_field(
            field,
            f"'{path}' is not a tinker path of this server: tinker://<model id>/weights/<name> "
            "or tinker://<model id>/sampler_weights/<name>",
        )
    return CheckpointPath(parts[0], parts[1], check_name(parts[2], field))


class CheckpointStore:
    """Checkpoint folders under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(os.path.join(self.root, "runs"), exist_ok=True)

    def folder(self, path: CheckpointPath) -> str:
        return os.path.join(self.root, "runs", path.run.replace(":", "_"), path.kind, path.name)

    def exists(self, path: CheckpointPath) -> bool:
        return os.path.isfile(os.path.join(self.folder(path), META_FILE))

    def save(
        self,
        path: CheckpointPath,
        adapter: Dict[str, torch.Tensor],
        peft_config: Any,
        meta: Dict[str, Any],
        optimizer: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        """Write the checkpoint's files; an existing one is replaced as a whole."""
        final = self.folder(path)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(final), prefix=f".{path.name}-")
        try:
            save_file(
                {k: v.contiguous() for k, v in adapter.items()}, os.path.join(tmp, ADAPTER_FILE)
            )
            peft_config.save_pretrained(tmp)
            if optimizer is not None:
                save_file(
                    {k: v.contiguous() for k, v in optimizer.items()},
                    os.path.join(tmp, OPTIMIZER_FILE),
                )
            meta = {**meta, "tinker_path": str(path), "time": time.time()}
            with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=2)
            if os.path.isdir(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def meta(self, path: CheckpointPath, field: str) -> Dict[str, Any]:
        """The checkpoint's metadata, with its peft config under ``"peft"``; a 404 naming
        ``field`` when there is no such checkpoint."""
        if not self.exists(path):
            raise TinkerError(404, f"{field}: no checkpoint {path} on this server", field)
        folder = self.folder(path)
        with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
            meta = json.load(f)
        with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
            meta["peft"] = json.load(f)
        return meta

    def load(
        self, path: CheckpointPath, field: str
    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
        """The adapter's tensors and the checkpoint's metadata (``meta``)."""
        meta = self.meta(path, field)
        return load_file(os.path.join(self.folder(path), ADAPTER_FILE)), meta

    def load_optimizer(self, path: CheckpointPath, field: str) -> Dict[str, torch.Tensor]:
        file = os.path.join(self.folder(path), OPTIMIZER_FILE)
        if not os.path.isfile(file):
            raise TinkerError(
                400,
                f"{field}: {path} holds no optimizer state (a sampler checkpoint, or one "
                "saved without it); load it without the optimizer",
                field,
            )
        return load_file(file)

    def listing(self, run: str) -> List[Dict[str, Any]]:
        """The run's checkpoints as the SDK's ``Checkpoint`` records, oldest first."""
        found = []
        for kind in KINDS:
            base = os.path.join(self.root, "runs", run.replace(":", "_"), kind)
            for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
                path = CheckpointPath(run, kind, name)
                if self.exists(path):
                    found.append(self._record(path))
        return [record for _, record in sorted(found, key=lambda pair: pair[0])]

    def _record(self, path: CheckpointPath) -> Tuple[float, Dict[str, Any]]:
        """(when it was written, the SDK's ``Checkpoint`` record)."""
        folder = self.folder(path)
        with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
            meta = json.load(f)
        size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        return meta["time"], {
            "checkpoint_id": f"{path.kind}/{path.name}",
            "checkpoint_type": "training" if path.kind == "weights" else "sampler",
            "time": iso_time(meta["time"]),
            "tinker_path": str(path),
            "size_bytes": size,
            "public": False,
            "user_metadata": meta.get("user_metadata"),
            "expires_at": None,
        }


def iso_time(timestamp: float) -> str:
    """A Unix time as the ISO 8601 text the SDK's datetimes read."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat()
