"""A Hugging Face hub cache built by hand, in the layout ``huggingface_hub`` itself writes
and reads, so that hub ids resolve offline in tests exactly as on a user's machine::

    <cache>/models--ORG--NAME/
        blobs/<git sha1 or sha256 of each file>
        refs/main                      (the commit hash)
        snapshots/<commit>/<file>  ->  ../../blobs/<hash>   (relative symlinks)

Datasets live in ``datasets--ORG--NAME`` the same way. Small files are named by their git
blob sha1 and large ones (LFS in a real repository) by their sha256, as the hub names them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Iterable, List, Optional

LFS_BYTES = 10 * 1024 * 1024  # at least this big, or a weights/data format: stored through LFS
LFS_SUFFIXES = (".safetensors", ".bin", ".parquet", ".gguf")


def repo_folder(cache: str, repo_id: str, repo_type: str = "model") -> str:
    """``<cache>/models--ORG--NAME`` (or ``datasets--``), as huggingface_hub names it."""
    return os.path.join(cache, f"{repo_type}s--" + repo_id.replace("/", "--"))


def _blob_name(data: bytes, path: str) -> str:
    if len(data) >= LFS_BYTES or path.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def files_of(folder: str) -> Dict[str, str]:
    """{path inside the repository: file on disk} of every file below ``folder``."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            full = os.path.join(root, name)
            found[os.path.relpath(full, folder).replace(os.sep, "/")] = full
    return found


def cache_repo(
    cache: str,
    repo_id: str,
    files: Dict[str, str],
    repo_type: str = "model",
    refs: Iterable[str] = ("main",),
    skip: Iterable[str] = (),
    incomplete: Optional[str] = None,
) -> str:
    """Put ``files`` ({path in the repository: source file}) in ``cache`` as one commit of
    ``repo_id`` that each of ``refs`` points at; returns its snapshot folder.

    ``skip``: paths left out of the snapshot (their blobs too), as a download interrupted
    before them leaves it; ``incomplete``: one of them whose blob is half-written
    (``<hash>.incomplete``, huggingface_hub's name for a blob being downloaded).
    """
    contents = {}
    for path, source in sorted(files.items()):
        with open(source, "rb") as f:
            contents[path] = f.read()
    commit = hashlib.sha1(
        b"".join(p.encode() + hashlib.sha1(d).digest() for p, d in contents.items())
    ).hexdigest()
    repo = repo_folder(cache, repo_id, repo_type)
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    skipped = set(skip)
    for path, data in contents.items():
        blob = _blob_name(data, path)
        if path in skipped:
            if path == incomplete:
                with open(os.path.join(repo, "blobs", blob + ".incomplete"), "wb") as f:
                    f.write(data[: len(data) // 2])
            continue
        with open(os.path.join(repo, "blobs", blob), "wb") as f:
            f.write(data)
        link = os.path.join(snapshot, path)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(
                os.path.relpath(os.path.join(repo, "blobs", blob), os.path.dirname(link)), link
            )
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    for ref in refs:
        with open(os.path.join(repo, "refs", ref), "w") as f:
            f.write(commit)
    return snapshot


def cache_dataset(
    cache: str, repo_id: str, subsets: Dict[str, Dict[str, List[dict]]], source: str
) -> str:
    """A dataset repository laid out as GSM8K's is on the hub: one folder of parquet shards
    per subset (``main/train-00000-of-00001.parquet``) and a README whose ``configs:`` name
    them; written under ``source`` first, then cached as ``repo_id``. Returns the snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = ["---", "configs:"]
    for subset, splits in subsets.items():
        lines += [f"- config_name: {subset}", "  data_files:"]
        for split, rows in splits.items():
            os.makedirs(os.path.join(source, subset), exist_ok=True)
            table = pa.Table.from_pylist(rows)
            pq.write_table(table, os.path.join(source, subset, f"{split}-00000-of-00001.parquet"))
            lines += [f"  - split: {split}", f"    path: {subset}/{split}-*"]
    with open(os.path.join(source, "README.md"), "w") as f:
        f.write("\n".join(lines + ["---", f"# {repo_id}", ""]))
    return cache_repo(cache, repo_id, files_of(source), repo_type="dataset")
