"""Run the corpus (or the entries whose label holds one of the PATTERNs) outside pytest,
print what each did, and write what it says into the manifest: ``now:`` where an entry does
not do what it should (its first line), ``message:`` where it is refused as it should be;
both are dropped where it trains as it should. Then ``python docs/gen_corpus.py``
regenerates the table.

    python -m tests.corpus.record [PATTERN ...]

The run is the corpus test's (tests/corpus/harness.py), in this process, offline, against a
Hugging Face cache in a temporary HF_HOME; nothing of the user's is read or written.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from typing import Dict, List, Optional

import yaml

_CUT = 160  # characters of a first line kept in the manifest


def said(text: str) -> str:
    """The part of a first line that stays the same from run to run: up to the first
    temporary path, at most ``_CUT`` characters, ending at a word."""
    text = re.split(r"/tmp/|/var/folders/", text)[0].rstrip(" ,:;(")
    if len(text) > _CUT:
        text = text[:_CUT].rsplit(" ", 1)[0]
    return text


def rewrite(manifest: str, found: Dict[str, Dict[str, Optional[str]]]) -> str:
    """``manifest``'s text with the ``now:``/``message:`` lines of the entries in ``found``
    ({label: {"now": text or None, "message": text or None}}) replaced; comments kept."""
    from tests.corpus.harness import Entry

    blocks = re.split(r"(?m)^(?=  - config: )", manifest)
    out = [blocks[0]]
    for block in blocks[1:]:
        (data,) = yaml.safe_load(block)
        entry = Entry(config=data.pop("config"), **data)
        if entry.label not in found:
            out.append(block)
            continue
        body = block.rstrip("\n").split("\n")
        tail = block[len(block.rstrip("\n")) :]
        body = [line for line in body if not re.match(r"    (now|message): ", line)]
        for key in ("message", "now"):
            value = found[entry.label][key]
            if value:
                body.append(f"    {key}: {json.dumps(value)}")
        out.append("\n".join(body) + (tail or "\n"))
    return "".join(out)


def main(patterns: List[str]) -> None:
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="offline")
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="corpus-hf-")
    os.environ["WANDB_DIR"] = tempfile.mkdtemp(prefix="corpus-wandb-")
    for name in [n for n in os.environ if n.startswith("TRINITY_")]:
        del os.environ[name]
    from huggingface_hub import constants

    from tests.corpus.harness import MANIFEST, REFUSED, Harness, read_manifest, verdict
    from trinity.demo.tiny import build_tiny_preset
    from trinity.runtime.launcher import run

    tmp = tempfile.mkdtemp(prefix="corpus-")
    harness = Harness(
        tmp, build_tiny_preset(os.path.join(tmp, "micro32"), "micro32"), constants.HF_HUB_CACHE
    )
    entries = read_manifest()
    by_label = {e.label: e for e in entries}
    found: Dict[str, Dict[str, Optional[str]]] = {}
    for entry in [e for e in entries if any(p in e.label for p in patterns)]:
        start = time.monotonic()
        if entry.after:
            harness.run(by_label[entry.after], run)
        outcome = harness.run(entry, run)
        wrong = verdict(entry, outcome)
        first = said(outcome.message or outcome.kind)
        right_refusal = wrong is None and entry.expect == REFUSED
        found[entry.label] = {
            "now": first if wrong else None,
            "message": first if right_refusal else None,
        }
        status = wrong or "as expected"
        print(
            f"{time.monotonic() - start:6.1f}s {entry.label}: {outcome.kind} | {status}", flush=True
        )
    with open(MANIFEST) as f:
        text = f.read()
    with open(MANIFEST, "w") as f:
        f.write(rewrite(text, found))


if __name__ == "__main__":
    main(sys.argv[1:] or [""])
