"""What a Hugging Face model, tokenizer or peft adapter folder must hold to load, read from
its files alone (no transformers): the checks before start and the hub resolver both ask."""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import List, Optional

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def missing_parts(folder: str, what: str) -> List[str]:
    """The parts a ``what`` ("model", "tokenizer" or "adapter") folder lacks, by name."""

    def has(*names: str) -> bool:
        return any(os.path.isfile(os.path.join(folder, name)) for name in names)

    if what == "adapter":
        missing = [] if has("adapter_config.json") else ["adapter_config.json"]
        return missing + ([] if has(*ADAPTER_WEIGHTS) else [" or ".join(ADAPTER_WEIGHTS)])
    missing = []
    if what == "model" and not has("config.json"):
        missing.append("config.json")
    if not has(*TOKENIZER_FILES):
        missing.append(f"tokenizer files ({', '.join(TOKENIZER_FILES)})")
    if what == "model" and not any(glob.glob(os.path.join(folder, p)) for p in WEIGHT_PATTERNS):
        missing.append(f"weights ({' or '.join(WEIGHT_PATTERNS)})")
    return missing


def weight_file_problems(folder: str) -> List[str]:
    """Weights of ``folder`` that are not whole: shards its safetensors index lists but the
    folder lacks, and safetensors files shorter than their own header says (a download or
    copy cut short), which transformers would only report with a stack trace."""
    index = os.path.join(folder, "model.safetensors.index.json")
    problems = []
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set((json.load(f).get("weight_map") or {}).values()))
        absent = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
        if absent:
            problems.append(
                f"{len(absent)} shard(s) that model.safetensors.index.json lists are missing "
                f"({absent[0]})"
            )
    for file in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        problem = _truncated(file)
        if problem:
            problems.append(problem)
    return problems


def _truncated(file: str) -> Optional[str]:
    """Whether a safetensors file is shorter than its header says: 8 bytes of header length,
    the JSON header, then the tensors, each at its [start, end) offset after the header."""
    name, size = os.path.basename(file), os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if length is None or 8 + length > size:
            return f"{name} is truncated ({size} bytes)"
        try:
            header = json.loads(f.read(length))
        except ValueError:
            return f"{name} is not a safetensors file (its header is not JSON)"
    ends = [
        t["data_offsets"][1] for t in header.values() if isinstance(t, dict) and "data_offsets" in t
    ]
    expected = 8 + length + max(ends, default=0)
    if size < expected:
        return f"{name} is truncated ({size} of {expected} bytes)"
    return None
