"""Console progress for ``trinity run``, read from the stage's JSON-lines metrics files.

On a terminal each stage has one live display (``StageProgress.render``: step of total,
elapsed, ETA, latest numbers, last evaluation, what the run waits for); elsewhere (a log
file, a pipe) one unwrapped line every ``every_steps`` steps or ``every_s`` seconds, and a
line per evaluation. Events (failures, runner states) and long waits are printed as they come.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console
from rich.live import Live

from trinity.common.weights import collective_backend
from trinity.monitor import read_metrics
from trinity.runtime.stage_progress import StageProgress
from trinity.utils.console import output_console

# A wait is shown once it has lasted this long and USUAL_STEPS times as long as a step
# usually takes (a fixed-sync explorer waits for the trainer at every step: that is the
# schedule, not news), then again every REPEAT_WAIT_S.
SHOW_WAIT_AFTER_S = 5.0
USUAL_STEPS = 2.0
REPEAT_WAIT_S = 30.0

# The roles whose metrics files a stage reads.
_FILES = ("explorer", "trainer", "bench")


def eval_summary(job_dir: str) -> Dict[str, Tuple[Tuple[int, float], Tuple[int, float]]]:
    """``eval/<taskset>/accuracy/mean`` (and reward) -> (first and last (step, value))."""
    series: Dict[str, List[Tuple[int, float]]] = {}
    for record in read_metrics(os.path.join(job_dir, "monitor", "explorer.jsonl")):
        for key, value in record.items():
            if key.startswith("eval/") and key.endswith(("accuracy/mean", "reward/mean")):
                series.setdefault(key, []).append((record["step"], value))
    return {k: (v[0], v[-1]) for k, v in series.items()}


# The roles whose metrics a stage of each mode writes (other modes: every file).
_ROLES = {
    "both": ("explorer", "trainer"),
    "colocate": ("explorer", "trainer"),
    "explore": ("explorer",),
    "train": ("trainer",),
    "serve": ("trainer",),  # the endpoint's counts are at GET /metrics
}
# The role whose records count a stage's steps.
_COUNTS = {"explore": "explorer", "bench": "bench"}


class ProgressPrinter:
    def __init__(
        self, console: Optional[Console] = None, every_steps: int = 10, every_s: float = 30.0
    ) -> None:
        # soft_wrap: a line longer than the console (a path, an event) is never broken in two;
        # off a terminal, tables (bench mode's) are not cut to 80 columns either
        self.console = console or output_console(highlight=False, soft_wrap=True)
        self.every_steps, self.every_s = every_steps, every_s
        self.offsets: Dict[str, int] = {}  # bytes of each metrics file already shown
        self.job_dir = ""
        self.events_seen = 0  # events of the status board already printed
        self.waits_shown: Dict[str, Tuple[float, float]] = {}  # role -> (since, when printed)
        self.progress: Optional[StageProgress] = None
        self.live: Optional[Live] = None
        self.last_line = (0, 0.0)  # (step, monotonic time) of the last progress line

    def new_board(self) -> None:
        """A stage starts with a new status board: nothing of it was printed yet."""
        self.events_seen = 0
        self.waits_shown = {}

    def begin_stage(self, config: Any, steps: int, start: int) -> None:
        self.job_dir = config.checkpoint_job_dir
        # A resumed run appends to the same files: show only what this run writes, of its
        # own roles (a decoupled run's other side shows its records on its own console).
        roles = [r for r in _FILES if r in _ROLES.get(config.mode, (r,))]
        self.offsets = {
            role: os.path.getsize(self._path(role)) if os.path.exists(self._path(role)) else 0
            for role in roles
        }
        resumed = f", resuming at step {start}" if start else ""
        self.console.print(
            f"[bold]stage {config.name}[/bold]: mode={config.mode} "
            f"algorithm={config.algorithm.algorithm_type} steps={steps}{resumed}\n"
            f"  outputs: {self.job_dir}"
        )
        if config.mode == "both" and config.synchronizer.sync_method == "nccl":
            backend = collective_backend(config.cluster.gpu_per_node > 0)
            self.console.print(
                f"  weight sync: nccl, a {backend} broadcast from the trainer to the engines"
            )
        counts = _COUNTS.get(config.mode, "trainer")
        self.progress = StageProgress(config.name, steps, start, counts)
        self.last_line = (start, time.monotonic())
        if self.console.is_terminal:
            self.live = Live(
                get_renderable=self.progress.render, console=self.console, refresh_per_second=2
            )
            self.live.start()

    def end_stage(self) -> None:
        """Close the stage's live display, or print its last line if not printed yet."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        elif self.progress is not None and self.progress.step > self.last_line[0]:
            self._line()
        self.progress = None

    def _path(self, role: str) -> str:
        return os.path.join(self.job_dir, "monitor", f"{role}.jsonl")

    def poll(self, status: Optional[Tuple[Dict, List]] = None) -> None:
        """Print new metric records, new events, and waits that last (``RunStatus.snapshot``)."""
        self._poll_metrics()
        if status is not None:
            waits, events = status
            self.events_seen += len(events)
            for role, text in events:
                self.console.print(f"  [yellow]{role:<8}[/yellow] {text}")
            self._print_waits(waits)

    def show_waits_after(self) -> float:
        """Seconds a wait lasts before it is shown: ``SHOW_WAIT_AFTER_S``, or ``USUAL_STEPS``
        usual steps when that is longer."""
        usual = self.progress.usual_step_s() if self.progress is not None else None
        return max(SHOW_WAIT_AFTER_S, USUAL_STEPS * usual) if usual else SHOW_WAIT_AFTER_S

    def _print_waits(self, waits: Dict[str, Tuple[str, float]]) -> None:
        now, after = time.time(), self.show_waits_after()
        if self.live is not None and self.progress is not None:  # shown in the display
            lasting = [(w, since) for w, since in waits.values() if now - since >= after]
            self.progress.waiting = min(lasting, key=lambda item: item[1]) if lasting else None
            return
        for role, (what, since) in waits.items():
            # One wait is one start time: its text may change as it goes (tasks left), but it
            # is printed when it begins and then every REPEAT_WAIT_S, not at every change.
            shown = self.waits_shown.get(role)
            due = shown is None or shown[0] != since or now - shown[1] >= REPEAT_WAIT_S
            if now - since >= after and due:
                self.console.print(f"  {role:<8} waiting {now - since:.0f}s for {what}")
                self.waits_shown[role] = (since, now)
        for role in set(self.waits_shown) - set(waits):
            del self.waits_shown[role]

    def _poll_metrics(self) -> None:
        if not self.job_dir:
            return
        for role in list(self.offsets):
            path = self._path(role)
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                f.seek(self.offsets.get(role, 0))
                text = f.read()
            complete = text[: text.rfind("\n") + 1]  # a half-written last line waits
            self.offsets[role] = self.offsets.get(role, 0) + len(complete.encode("utf-8"))
            for line in complete.splitlines():
                self._print(role, json.loads(line))

    def _print(self, role: str, record: Dict[str, Any]) -> None:
        if self.progress is None:
            return
        if self.progress.update(role, record) and self.live is None:
            kind = "bench" if role == "bench" else "eval"
            shown = "  ".join(f"{k}={v:.3f}" for k, v in sorted(self.progress.evals.items()))
            self.console.print(f"  [cyan]{kind:<8}[/cyan] step {record['step']:>4}  {shown}")
        step, at = self.last_line
        due = self.progress.step - step >= self.every_steps
        due = (
            due
            or time.monotonic() - at >= self.every_s
            or self.progress.step == self.progress.total
        )
        if self.live is None and self.progress.step > step and due:
            self._line()

    def _line(self) -> None:
        self.console.print("  " + self.progress.line())
        self.last_line = (self.progress.step, time.monotonic())

    def summary(self, results: List[Any]) -> None:
        self.end_stage()
        self.console.print("\n[bold]run finished[/bold]")
        for r in results:
            self.console.print(f"  {r.name}: {r.job_dir}")
            if r.final_hf and r.bench is None:
                self.console.print(f"    final weights (HF): {r.final_hf}")
            for key, ((s0, v0), (s1, v1)) in sorted(r.evals.items()):
                self.console.print(f"    {key}: {v0:.3f} (step {s0}) -> {v1:.3f} (step {s1})")
            plots = os.path.join(r.job_dir, "monitor", "plots.png")
            if os.path.exists(plots):
                self.console.print(f"    plots: {plots}")
            if r.bench is not None:
                from trinity.explorer.bench import bench_table

                self.console.print(bench_table(r.bench, title=f"bench of {r.name}"))
