"""Console progress for ``trinity run``, read from the stage's JSON-lines metrics files."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console

from trinity.monitor import read_metrics

# A wait is shown once it has lasted this long, then again every REPEAT_WAIT_S.
SHOW_WAIT_AFTER_S = 5.0
REPEAT_WAIT_S = 30.0

# (metric, short label) shown per role when present.
_SHOWN = {
    "explorer": [("rollout/reward/mean", "reward"), ("rollout/accuracy/mean", "acc")],
    "trainer": [
        ("actor/pg_loss", "pg_loss"),
        ("actor/sft_loss", "sft_loss"),
        ("critic/rewards/mean", "reward"),
        ("actor/kl_loss", "kl"),
        ("actor/lr", "lr"),
    ],
    "bench": [],  # mode bench: its records are evaluations, printed as such
}


def eval_summary(job_dir: str) -> Dict[str, Tuple[Tuple[int, float], Tuple[int, float]]]:
    """``eval/<taskset>/accuracy/mean`` (and reward) -> (first and last (step, value))."""
    series: Dict[str, List[Tuple[int, float]]] = {}
    for record in read_metrics(os.path.join(job_dir, "monitor", "explorer.jsonl")):
        for key, value in record.items():
            if key.startswith("eval/") and key.endswith(("accuracy/mean", "reward/mean")):
                series.setdefault(key, []).append((record["step"], value))
    return {k: (v[0], v[-1]) for k, v in series.items()}


# The roles whose metrics a stage of each mode writes (other modes: every shown file).
_ROLES = {"both": ("explorer", "trainer"), "explore": ("explorer",), "train": ("trainer",)}


class ProgressPrinter:
    def __init__(self) -> None:
        self.console = Console(highlight=False)
        self.offsets: Dict[str, int] = {}  # bytes of each metrics file already shown
        self.job_dir = ""
        self.events_seen = 0  # events of the status board already printed
        self.waits_shown: Dict[str, Tuple[str, float]] = {}  # role -> (what, when printed)

    def new_board(self) -> None:
        """A stage starts with a new status board: nothing of it was printed yet."""
        self.events_seen = 0
        self.waits_shown = {}

    def begin_stage(self, config: Any, steps: int, start: int) -> None:
        self.job_dir = config.checkpoint_job_dir
        # A resumed run appends to the same files: show only what this run writes, of its
        # own roles (a decoupled run's other side shows its records on its own console).
        roles = [r for r in _SHOWN if r in _ROLES.get(config.mode, (r,))]
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

    def _print_waits(self, waits: Dict[str, Tuple[str, float]]) -> None:
        now = time.time()
        for role, (what, since) in waits.items():
            shown = self.waits_shown.get(role)
            due = shown is None or shown[0] != what or now - shown[1] >= REPEAT_WAIT_S
            if now - since >= SHOW_WAIT_AFTER_S and due:
                self.console.print(f"  {role:<8} waiting {now - since:.0f}s for {what}")
                self.waits_shown[role] = (what, now)
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
        kind = "bench" if role == "bench" else "eval"
        evals = {
            k[len(kind) + 1 : -len("/mean")]: v
            for k, v in record.items()
            if k.startswith(f"{kind}/") and k.endswith(("/accuracy/mean", "/reward/mean"))
        }
        if evals:
            shown = "  ".join(f"{k}={v:.3f}" for k, v in sorted(evals.items()))
            self.console.print(f"  [cyan]{kind:<8}[/cyan] step {record['step']:>4}  {shown}")
            return
        parts = [f"{label}={record[key]:.4g}" for key, label in _SHOWN[role] if key in record]
        if parts:
            self.console.print(f"  {role:<8} step {record['step']:>4}  " + "  ".join(parts))

    def summary(self, results: List[Any]) -> None:
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
