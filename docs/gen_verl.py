"""The key tables of "Coming from veRL", generated from the converter.

``python docs/gen_verl.py`` rewrites ``docs/reference/verl.md`` below its marker line (as
``gen_reference.py`` does its page; a unit test fails when the page is out of date);
``verl_markdown()`` returns the tables alone. Sources: ``TABLE``, ``ESTIMATORS`` and
``KL_NAMES`` of ``trinity/common/config/convert_verl.py``, and the veRL key tree that
``trainer.trainer_config`` declares (``trinity/common/config/verl.py``: its ``MOVED_KEYS``
and which keys are ``inert``).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # document the checkout this file is in
    sys.path.insert(0, str(HERE.parent))

from trinity.common.config.convert_verl import ESTIMATORS, KL_NAMES, TABLE  # noqa: E402
from trinity.common.config.verl import VerlOptimConfig, VerlTrainerConfig  # noqa: E402

PAGE = HERE / "reference" / "verl.md"
TRAINER_CONFIG = "trainer.trainer_config"
# The reference page's rows and anchors, shared rather than re-implemented.
_REFERENCE = runpy.run_path(str(HERE / "gen_reference.py"), run_name="gen_reference")


def _table(header: Tuple[str, ...], rows: List[Tuple[str, ...]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _moved(model: type = VerlTrainerConfig, prefix: str = "") -> Iterator[Tuple[str, str]]:
    """(veRL path under trainer_config, where Trinity keeps it) for every moved key."""
    for key, home in getattr(model, "MOVED_KEYS", {}).items():
        yield f"{prefix}{key}", home
    for name, field in model.model_fields.items():
        child = field.annotation
        if isinstance(child, type) and hasattr(child, "model_fields"):
            yield from _moved(child, f"{prefix}{name}.")


def _kept() -> List[Tuple[str, str, str]]:
    """(veRL path, default, what the native trainer does with it) for every leaf key."""
    kept = []
    for row in _REFERENCE["rows"]():
        if row.path.startswith(f"{TRAINER_CONFIG}.") and row.section is None:
            path = row.path.removeprefix(f"{TRAINER_CONFIG}.")
            used = _REFERENCE["_cell"](row.runs.replace("yes, except ", "used; "))
            used = "used" if row.runs == "yes" else used
            kept.append((f"`{path}`", f"`{row.default}`" if row.default else "", used))
    return kept


def verl_markdown() -> str:
    """The tables: renamed keys, estimators, KL names, optimizer keys, moved keys, kept keys."""
    optim = {f"actor_rollout_ref.actor.optim.{k}": f"algorithm.optimizer.{k}" for k in
             VerlOptimConfig.model_fields if k != "total_training_steps"}  # fmt: skip
    renamed = sorted({**TABLE, **optim}.items())
    out = [
        "\n## Key by key {#key-by-key}\n",
        "What `trinity convert-verl` writes for each veRL key",
    ]
    out += ["that maps to one Trinity key.\n"]
    out += _table(("veRL", "Trinity-RFT"), [(f"`{v}`", f"`{t}`") for v, t in renamed])
    out += ["\n## Advantage estimators {#advantage-estimators}\n"]
    out += ["`algorithm.adv_estimator` sets two keys.\n"]
    rows = [(f"`{e}`", f"`{a}`", f"`{f}`") for e, (a, f) in ESTIMATORS.items()]
    out += _table(
        ("`adv_estimator`", "`algorithm.algorithm_type`", "`algorithm.advantage_fn`"), rows
    )
    out += ["\n## KL estimators {#kl-estimators}\n"]
    out += ["veRL's `kl_penalty` and `kl_loss_type` names, and the Trinity `KL_FN` names they"]
    out += ["become in `algorithm.kl_penalty_fn` and `algorithm.kl_loss_fn`.\n"]
    out += _table(("veRL", "Trinity-RFT"), [(f"`{v}`", f"`{t}`") for v, t in KL_NAMES.items()])
    out += ["\n## Keys that moved {#moved-keys}\n"]
    out += [f"Written under `{TRAINER_CONFIG}`, these veRL keys are errors that name the"]
    out += ["Trinity key holding the same setting.\n"]
    moved: Dict[str, str] = dict(_moved())
    rows = [(f"`{TRAINER_CONFIG}.{k}`", f"`{v}`") for k, v in sorted(moved.items())]
    out += _table(("veRL key", "set instead"), rows)
    out += [f"\n## Keys kept under `{TRAINER_CONFIG}` {{#trainer-config-keys}}\n"]
    out += ["Every veRL key the tree declares, and what the native trainer does with it. Keys"]
    out += ["it uses are also described in the"]
    out += ["[configuration reference](configuration.md#trainer-trainer_config).\n"]
    out += _table(("veRL key", "default", "here"), _kept())
    return "\n".join(out) + "\n"


def generated_page() -> str:
    """What ``python docs/gen_verl.py`` writes to ``PAGE``."""
    return _REFERENCE["page_text"](PAGE, "gen_verl.py", verl_markdown())


if __name__ == "__main__":
    PAGE.write_text(generated_page(), encoding="utf-8")
