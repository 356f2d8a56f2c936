"""Hugging Face hub ids to local folders, through ``huggingface_hub``: its cache, its offline
mode, its downloads (docs/design-notes.md, "Models and data by hub id").

A config value names a hub repository when no local path of that name exists (a local
folder wins) and it reads as an id: ``NAME`` or ``ORG/NAME``, optionally followed by
``@REVISION`` (a branch, tag or commit, as ``hf://`` paths write it). ``resolve`` turns it
into the snapshot folder of that revision with ``huggingface_hub.snapshot_download``, which
downloads what is missing (with its progress bars) unless ``HF_HUB_OFFLINE=1``, and reads
the cache at ``HF_HUB_CACHE`` (``HF_HOME/hub``, by default ``~/.cache/huggingface/hub``).
Whatever goes wrong is one ``HubError`` line naming the key, the id and the next step.

``huggingface_hub`` is imported by the functions that use it: reading an id costs nothing.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from trinity.utils.model_files import missing_parts, weight_file_problems

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_-])?"
_ID = re.compile(rf"(?:{_NAME}/)?{_NAME}")
_MAX_ID = 96  # the hub's limit on a repository id
# A missing local data file is reported as one, not looked up as a repository.
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow", ".jinja", ".gguf")
# <cache>/models--ORG--NAME/snapshots/<commit>: a folder resolve() returned.
_SNAPSHOT = re.compile(r"(models|datasets)--(.+?)/snapshots/([0-9a-f]{40})/?$")

# What a model repository holds that this project never reads: other frameworks' weights and
# exports. PyTorch .bin weights are fetched only when the repository has no safetensors.
_NOT_READ = ["*.onnx", "*.onnx_data", "*.gguf", "*.msgpack", "*.h5", "*.ot", "*.tflite"]
_TORCH_PICKLES = ["*.bin", "*.pt", "*.pth"]
_TOKENIZER_FILES = ["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
WEIGHTS = "*.safetensors"


class HubError(ValueError):
    """An id that cannot become a local folder; the message is one line with the next step."""


@dataclass(frozen=True)
class HubRef:
    """A repository on the hub, as a config value names it."""

    repo_id: str
    revision: Optional[str]
    repo_type: str  # "model" or "dataset"

    def download_command(self) -> str:
        """The ``hf`` command that puts this repository in the cache."""
        command = f"hf download {self.repo_id}"
        if self.repo_type == "dataset":
            command += " --repo-type dataset"
        return command + (f" --revision {self.revision}" if self.revision else "")

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def hub_ref(value: Optional[str], repo_type: str) -> Optional[HubRef]:
    """The repository ``value`` names, or None: no value, an existing local path, or text
    that is not an id (a path with more parts, ``./x``, ``~/x``, a data file's name)."""
    if not value or os.path.exists(os.path.expanduser(value)):
        return None
    name, sep, revision = value.partition("@")
    if sep and not revision.strip():
        return None
    if not _ID.fullmatch(name) or "--" in name or ".." in name or len(name) > _MAX_ID:
        return None
    if name.lower().endswith((".git", *_FILE_SUFFIXES)):
        return None
    return HubRef(name, revision or None, repo_type)


def cached_repo_of(path: Optional[str]) -> Optional[str]:
    """``ORG/NAME@abc1234`` when ``path`` is a snapshot folder of a hub cache, else None:
    messages about a resolved folder name the repository too."""
    found = _SNAPSHOT.search(path or "")
    if found is None:
        return None
    return f"{found.group(2).replace('--', '/')}@{found.group(3)[:7]}"


def resolve(key: str, value: str, ref: HubRef, *, download: bool, what: str) -> str:
    """The local snapshot folder of ``ref`` (``key = value`` in the config), downloaded
    unless ``download`` is false or the hub is offline; raises ``HubError``.

    ``what`` a model repository is read as: "model" (config, tokenizer, safetensors weights;
    ``.bin`` weights only where there are no safetensors), "adapter" (a peft adapter: the
    same files) or "tokenizer" (its files only). A dataset: the whole repository (its README
    says its subsets)."""
    if ref.repo_type == "dataset":
        folder = _snapshot(key, value, ref, download, None, None)
        return _checked(key, value, ref, folder, missing_dataset_files(folder))
    if what == "tokenizer":
        folder = _snapshot(key, value, ref, download, _TOKENIZER_FILES, None)
        return _checked(key, value, ref, folder, missing_model_files(folder, what))
    folder = _snapshot(key, value, ref, download, None, _NOT_READ + _TORCH_PICKLES)
    sharded = os.path.isfile(os.path.join(folder, "model.safetensors.index.json"))
    if not glob.glob(os.path.join(folder, WEIGHTS)) and not sharded:
        # an older repository (PyTorch pickles only): take its .bin weights too
        revision = os.path.basename(folder)  # the commit: the same snapshot, never a newer one
        pinned = HubRef(ref.repo_id, revision, ref.repo_type)
        folder = _snapshot(key, value, pinned, download, ["*.bin"], None)
    return _checked(key, value, ref, folder, missing_model_files(folder, what))


def _snapshot(
    key: str,
    value: str,
    ref: HubRef,
    download: bool,
    allow: Optional[List[str]],
    ignore: Optional[List[str]],
) -> str:
    from huggingface_hub import errors, snapshot_download

    try:
        return snapshot_download(
            ref.repo_id,
            repo_type=ref.repo_type,
            revision=ref.revision,
            local_files_only=not download,
            allow_patterns=allow,
            ignore_patterns=ignore,
        )
    except errors.GatedRepoError:
        raise HubError(
            f"{key} = {value}: {ref.repo_id} is a gated repository: accept its conditions on "
            f"{_page(ref)} and log in (`hf auth login`, or set HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"{key} = {value}: no folder {os.path.abspath(value)}, and no {ref.repo_type} "
            f"{ref.repo_id} on the hub that this login may read (a private repository needs "
            "`hf auth login` or HF_TOKEN); check the name"
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(
            f"{key} = {value}: {ref.repo_id} has no revision '{ref.revision}' on the hub; use "
            f"a branch, tag or commit of {_page(ref)}"
        ) from None
    except errors.LocalEntryNotFoundError as exc:
        raise HubError(_not_cached(key, value, ref, exc, download)) from None
    except errors.HfHubHTTPError as exc:  # the hub is down, refuses the token, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HubError(f"{key} = {value}: the hub refused {ref.repo_id}: {reason}") from None


def _page(ref: HubRef) -> str:
    from huggingface_hub import constants

    prefix = "datasets/" if ref.repo_type == "dataset" else ""
    return f"{constants.ENDPOINT}/{prefix}{ref.repo_id}"


def repo_cache_folder(ref: HubRef) -> str:
    """``<HF_HUB_CACHE>/models--ORG--NAME`` (or ``datasets--``): where the cache keeps it."""
    from huggingface_hub import constants

    return os.path.join(
        constants.HF_HUB_CACHE, f"{ref.repo_type}s--{ref.repo_id.replace('/', '--')}"
    )


def cached_revisions(ref: HubRef) -> List[str]:
    """The revisions the cache holds for ``ref``'s repository: ``main -> abc1234``, and the
    commits no branch or tag names."""
    repo = repo_cache_folder(ref)
    named = {}
    for ref_file in sorted(glob.glob(os.path.join(repo, "refs", "**", "*"), recursive=True)):
        if os.path.isfile(ref_file):
            with open(ref_file, encoding="utf-8") as f:
                named[os.path.relpath(ref_file, os.path.join(repo, "refs"))] = f.read().strip()
    commits = sorted(os.listdir(os.path.join(repo, "snapshots"))) if os.path.isdir(repo) else []
    shown = [f"{name} -> {commit[:7]}" for name, commit in named.items() if commit in commits]
    return shown + [c[:7] for c in commits if c not in named.values()]


def _not_cached(key: str, value: str, ref: HubRef, exc: Exception, download: bool) -> str:
    """The cache lacks ``ref`` and the hub was not asked (offline) or not reached."""
    from huggingface_hub import constants, errors

    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    if incomplete and isinstance(exc, incomplete):  # huggingface_hub knows the file list
        folder = getattr(exc, "snapshot_path", None) or repo_cache_folder(ref)
        listed = re.search(r"\d+ file\(s\) are missing \([^)]*\)", str(exc))
        return _incomplete(key, value, ref, folder, [listed.group(0) if listed else "files"])
    cause = exc.__cause__ or exc.__context__
    if not download:
        why = "the cache is read without downloading here"
    elif constants.HF_HUB_OFFLINE or isinstance(cause, errors.OfflineModeIsEnabled):
        why = "HF_HUB_OFFLINE=1 reads the cache only"
    else:
        why = f"the hub could not be reached ({type(cause or exc).__name__})"
    held = cached_revisions(ref)
    if held and ref.revision:
        return (
            f"{key} = {value}: revision '{ref.revision}' of {ref.repo_id} is not in the "
            f"Hugging Face cache, which holds {', '.join(held)}, and {why}; download it with "
            f"`{ref.download_command()}`, or name a cached revision"
        )
    return (
        f"{key} = {value}: no folder {os.path.abspath(value)}, and the {ref.repo_type} "
        f"{ref.repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}); {why}: "
        f"download it with `{ref.download_command()}`, or give a local folder"
    )


def _checked(key: str, value: str, ref: HubRef, folder: str, missing: Sequence[str]) -> str:
    if missing:
        raise HubError(_incomplete(key, value, ref, folder, missing))
    return folder


def _incomplete(key: str, value: str, ref: HubRef, folder: str, missing: Sequence[str] = ()) -> str:
    partial = glob.glob(os.path.join(repo_cache_folder(ref), "blobs", "*.incomplete"))
    lacks = f"{key} = {value}: the cached snapshot {folder} lacks {'; '.join(missing)}"
    if partial:
        why = f"an interrupted download left {len(partial)} partly downloaded file(s)"
    else:
        why = "an interrupted download, or a repository without them"
    return f"{lacks} ({why}); run `{ref.download_command()}` to finish it"


def missing_model_files(folder: str, what: str) -> List[str]:
    """What a ``what`` ("model", "tokenizer" or "adapter") snapshot lacks to load: files
    whose blob is gone, its parts (``model_files``), whole weights."""
    missing = [f"{path} (its blob is gone)" for path in _dangling(folder)]
    missing += missing_parts(folder, what)
    return missing + (weight_file_problems(folder) if what != "tokenizer" else [])


def missing_dataset_files(folder: str) -> List[str]:
    """What a dataset snapshot lacks: files whose blob is gone, or any data file at all."""
    missing = [f"{path} (its blob is gone)" for path in _dangling(folder)]
    data = [
        path
        for path in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
        if os.path.isfile(path) and os.path.basename(path) not in ("README.md", ".gitattributes")
    ]
    return missing if data else [*missing, "data files"]


def _dangling(folder: str) -> List[str]:
    """Files of ``folder`` that are links to blobs no longer there."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) and not os.path.exists(path):
                found.append(os.path.relpath(path, folder))
    return sorted(found)
