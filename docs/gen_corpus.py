"""The table of "Configs of the original Trinity-RFT", generated from the corpus manifest.

``python docs/gen_corpus.py`` rewrites ``docs/reference/trinity-rft-configs.md`` below its
marker line (as ``gen_reference.py`` does its page; a unit test fails when the page is out of
date). Sources: ``tests/corpus/trinity_rft/expected.yaml`` (what each config should do, and
what it does now where that differs) and the configs themselves (what the harness fills in,
``tests/corpus/plan.py``).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # document the checkout this file is in
    sys.path.insert(0, str(HERE.parent))

from tests.corpus.harness import CORPUS, REFUSED, Entry, read_manifest  # noqa: E402
from tests.corpus.plan import make_plan, read_raw  # noqa: E402

PAGE = HERE / "reference" / "trinity-rft-configs.md"
_REFERENCE = runpy.run_path(str(HERE / "gen_reference.py"), run_name="gen_reference")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _should(entry: Entry) -> str:
    if entry.expect == REFUSED:
        return "refused: " + (f"needs {entry.needs}" if entry.needs else f"lacks {entry.lacks}")
    return {"trains": "trains 1 step", "explores": "explores 1 step"}[entry.expect]


def _said(entry: Entry) -> str:
    """The first line of what it says today, where it says something."""
    text = entry.now or entry.message
    return f"`{_cell(text)}`" if text else "-"


def _fills(entry: Entry) -> str:
    plan = make_plan(read_raw(os.path.join(CORPUS, entry.config)), "MODEL", lambda s: "DATA")
    filled = [f"`{k}`: {v}" for k, v in plan.fills.items()]
    return "<br>".join(_cell(f) for f in filled + [f"`{v}` (README)" for v in entry.variant])


def _row(entry: Entry) -> List[str]:
    config = entry.path.replace("examples/", "", 1)
    now = "no" if entry.now else "yes"
    return [entry.release, f"`{config}`", _cell(_should(entry)), now, _said(entry), _fills(entry)]


def corpus_markdown() -> str:
    """The summary line and the table, one row per manifest entry."""
    entries = read_manifest()
    local = [e for e in entries if not e.needs]
    meets = [e for e in entries if not e.now]
    local_running = [e for e in local if e.expect != REFUSED and not e.now]
    out = [
        f"{len(entries)} runs of {len({e.config for e in entries})} configs: {len(meets)} do "
        f"what they should today. Of the {len(local)} that need nothing outside this machine, "
        f"{len(local_running)} train (or explore) one step today.\n"
    ]
    header = ["Release", "Config (`examples/...`)", "Should", "Does it now", "It says", "Filled in"]
    out += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(_row(e)) + " |" for e in entries]
    return "\n".join(out) + "\n"


def generated_page() -> str:
    """What ``python docs/gen_corpus.py`` writes to ``PAGE``."""
    return _REFERENCE["page_text"](PAGE, "gen_corpus.py", corpus_markdown())


if __name__ == "__main__":
    PAGE.write_text(generated_page(), encoding="utf-8")
