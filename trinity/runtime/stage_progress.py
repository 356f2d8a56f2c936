"""Where a stage is: step of total, elapsed and ETA, its latest numbers, its last evaluation.

``StageProgress`` is fed the stage's metric records as they arrive and says it either as one
line (a log, a pipe) or as a rich renderable for a live terminal display. It shows only the
numbers the stage produces: a reward only when the stage explores, the losses its algorithm
logs (``sft_loss`` for SFT, ``pg_loss`` for GRPO...), evaluations once there is one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Dict, List, Optional, Set, Tuple

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

# A trainer record's numbers worth a glance, in this order, when the stage logs them.
LOSSES = ("actor/pg_loss", "actor/sft_loss", "actor/dpo_loss", "actor/kl_loss", "critic/vf_loss")
EVAL_ENDINGS = ("/accuracy/mean", "/reward/mean")
# How many of the latest steps' durations say how long a step usually takes.
USUAL_OF_LAST = 10


def clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass
class StageProgress:
    name: str
    total: int  # planned steps
    start: int = 0  # the step a resumed stage continues after
    counts: str = "trainer"  # the role whose records count the steps ("bench": checkpoints)
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    numbers: Dict[str, float] = field(default_factory=dict)  # label -> latest value
    evals: Dict[str, float] = field(default_factory=dict)  # "<taskset> accuracy" -> value
    eval_step: Optional[int] = None
    waiting: Optional[Tuple[str, float]] = None  # (what, since: unix time)
    benched: Set[int] = field(default_factory=set)  # bench: the checkpoints' train steps done
    step_seconds: List[float] = field(default_factory=list)  # the latest steps' durations
    advanced: float = 0.0  # monotonic time the step count last moved

    def __post_init__(self) -> None:
        self.step = max(self.step, self.start)
        self.advanced = self.started  # the first step is timed from the stage's start

    def usual_step_s(self) -> Optional[float]:
        """The median duration of the latest steps; None before one was seen."""
        return median(self.step_seconds) if self.step_seconds else None

    def _count(self, step: int) -> None:
        """Move the step count, timing the steps it moved by (several may arrive at once)."""
        if step <= self.step:
            return
        now = time.monotonic()
        each = (now - self.advanced) / (step - self.step)
        self.step_seconds = (self.step_seconds + [each])[-USUAL_OF_LAST:]
        self.step, self.advanced = step, now

    def update(self, role: str, record: Dict[str, Any]) -> bool:
        """Take one metrics record; whether it was an evaluation (its own line off-terminal)."""
        kind = "bench" if role == "bench" else "eval"
        found = {
            k[len(kind) + 1 :].rsplit("/", 1)[0].replace("/", " "): v
            for k, v in record.items()
            if k.startswith(f"{kind}/") and k.endswith(EVAL_ENDINGS) and _number(v)
        }
        if found:
            self.evals, self.eval_step = found, record["step"]
        if role == self.counts == "bench":
            # A bench record's step is its checkpoint's train step (350), not how many of
            # the planned checkpoints are done: count those.
            self.benched.add(int(record["step"]))
            self._count(self.start + len(self.benched))
        elif role == self.counts:
            self._count(int(record["step"]))
        if role == "explorer" and _number(record.get("rollout/reward/mean")):
            self.numbers["reward"] = record["rollout/reward/mean"]
        if role == "trainer":
            for key in LOSSES:
                if _number(record.get(key)):
                    self.numbers[key.split("/", 1)[1]] = record[key]
        return bool(found)

    def timing(self) -> Tuple[float, Optional[float]]:
        """(seconds elapsed, seconds left at this stage's pace so far, or None before a step)."""
        elapsed = time.monotonic() - self.started
        done = self.step - self.start
        left = elapsed / done * (self.total - self.step) if done > 0 else None
        return elapsed, left

    def _parts(self) -> Tuple[str, str, str]:
        elapsed, left = self.timing()
        eta = "ETA " + (clock(left) if left is not None else "?")
        unit, kind = ("checkpoint", "bench") if self.counts == "bench" else ("step", "eval")
        head = f"{unit} {self.step}/{self.total}  {clock(elapsed)} elapsed, {eta}"
        numbers = "  ".join(f"{k} {v:.4g}" for k, v in self.numbers.items())
        evals = "  ".join(f"{k} {v:.3f}" for k, v in sorted(self.evals.items()))
        last = f"{kind} (step {self.eval_step}): {evals}" if self.evals else ""
        return head, numbers, last

    def line(self) -> str:
        """One unwrapped line for logs and pipes."""
        return " | ".join(part for part in (self.name, *self._parts()) if part)

    def wait_text(self) -> Optional[str]:
        if self.waiting is None:
            return None
        what, since = self.waiting
        return f"waiting {time.time() - since:.0f}s for {what}"

    def render(self) -> Group:
        """The live display: a bar, then the numbers, the last evaluation, the current wait."""
        head, numbers, last = self._parts()
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            Text(self.name, style="bold"),
            ProgressBar(total=max(1, self.total), completed=self.step, width=30),
            Text(head),
        )
        rows = [bar] + [Text("  " + t) for t in (numbers, last) if t]
        wait = self.wait_text()
        if wait:
            rows.append(Text("  " + wait, style="yellow"))
        return Group(*rows)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
