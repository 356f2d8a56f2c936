"""``mode: bench``: evaluate the checkpoints of a finished run on its eval tasksets.

The run is the job dir of the bench config's own ``project``/``name``: a user runs the
training YAML again with ``mode: bench``. Which checkpoints (``bench_steps``): those in
``explorer.bench_checkpoints``; else only the newest with
``explorer.bench_on_latest_checkpoint``; else every complete ``global_step_N``, after the
base model (step 0) when ``explorer.eval_on_startup`` is set; an external rollout model (an
API, ``model.external_model``) has no checkpoints and is evaluated once, as step 0. Each is
loaded from disk into
the engines (``checkpoint`` sync) and evaluated; one metrics record per checkpoint, named
``bench/<taskset>/...`` at step N, goes to the ``bench`` role's monitor
(``monitor/bench.jsonl``, runs ``<name>_bench``): the training run's own explorer records and
tracker runs are left as they were.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from rich.table import Table

from trinity.common.weights import complete_steps

# Metrics of a bench record shown in the table, in this order when present.
TABLE_METRICS = ("accuracy", "reward", "response_length", "logprob")


class BenchError(RuntimeError):
    """The engines do not hold the checkpoint bench mode asked them to load."""


def bench_steps(config: Any) -> List[int]:
    """The train steps bench mode evaluates, ascending (0: the base model); see the module."""
    explorer, job_dir = config.explorer, config.checkpoint_job_dir
    if explorer.rollout_model.engine_type == "external":
        return [0]  # an API's model has no checkpoints: it is evaluated once, as it is
    if explorer.bench_checkpoints:
        return sorted(set(explorer.bench_checkpoints))
    saved = complete_steps(job_dir)
    if explorer.bench_on_latest_checkpoint:
        return saved[-1:]
    return ([0] if explorer.eval_on_startup else []) + saved


def run_bench(explorer: Any, steps: List[int], load: Callable[[int], int]) -> List[Dict]:
    """Evaluate each of ``steps`` in order; the records, ``{"step": N, metric: value...}``.

    ``load(N)`` puts checkpoint N's weights in every engine (0: the base weights they
    started with, so step 0 comes first) and returns the version the engines report.
    """
    records = []
    for step in steps:
        version = load(step)
        if version != step:
            raise BenchError(f"bench: the engines hold model version {version}, not {step}")
        explorer.version = version
        metrics = explorer.evaluate(step, prefix="bench")
        records.append({"step": step, **metrics})
    return records


def bench_table(records: List[Dict], title: str = "bench") -> Table:
    """A table of checkpoint step x each eval taskset's mean metrics (``TABLE_METRICS``)."""
    columns = sorted(
        {column for record in records for column in map(_column, record) if column},
        key=lambda c: (c[0], TABLE_METRICS.index(c[1])),
    )
    table = Table(title=title)
    table.add_column("checkpoint step", justify="right")
    for taskset, metric in columns:
        table.add_column(f"{taskset} {metric}", justify="right")
    for record in records:
        keys = [f"bench/{taskset}/{metric}/mean" for taskset, metric in columns]
        cells = [f"{record[k]:.4g}" if k in record else "-" for k in keys]
        step = record["step"]
        table.add_row(f"{step} (base)" if step == 0 else str(step), *cells)
    return table


def _column(key: str) -> Optional[Tuple[str, str]]:
    """(taskset, metric) of a ``bench/<taskset>/<metric>/mean`` key shown in the table."""
    parts = key.split("/")
    if len(parts) == 4 and parts[0] == "bench" and parts[3] == "mean":
        if parts[2] in TABLE_METRICS:
            return parts[1], parts[2]
    return None
