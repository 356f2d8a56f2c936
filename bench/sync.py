"""Weight-sync seconds by model size, for the ``memory`` and ``checkpoint`` methods.

Each round runs the project's own code: ``TrainerRole._publish`` on the trainer side and
``ExplorerRole._sync`` on the explorer side (called on stand-in instances that carry only
the attributes those methods read), a real ``Synchronizer`` actor between them and a real
``EngineActor`` (a ``TransformersEngine``) receiving the weights in its own process:

- ``memory``: detach-and-clone the state dict, ``ray.put`` it, publish the ref; the engine
  actor gets the dict from the object store and ``load_state_dict`` copies it in.
- ``checkpoint``: ``save_checkpoint`` writes the weights (``actor/model.safetensors``; no
  optimizer state, see below), the path is published; the engine reads it and copies it in.

``publish_s`` is the trainer's share (until ``_publish`` returns), ``receive_s`` the
explorer's (until every engine holds the new version), ``total_s`` their sum; each is the
median over ``--repeats`` rounds after one warm-up round, and ``best_total_s`` is the
fastest round. The real ``Trainer.save`` also writes the AdamW state (about twice the
weights) in the checkpoint call; that is left out here so both methods move the same
bytes. The trainer's model is a fresh random init, different from the engine's, so every
round copies real new values; ``weights_match`` records that the engine ended up with
them. It measures; it asserts nothing.

Sizes (character vocabulary of 100 tokens, tied embeddings, Llama blocks)::

    1m:   hidden 128,  4 layers,  4 heads, MLP 512   ->   1.06M parameters
    25m:  the "25m" tiny preset (512, 8, 8, 1408)    ->  25.8M
    100m: hidden 1024, 8 layers, 16 heads, MLP 2816  -> 102.9M

Usage::

    python bench/sync.py --out sync.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch

from trinity.common.sync_schedule import Wanted
from trinity.demo.tiny import TINY_PRESETS, build_tiny_model
from trinity.trainer.checkpoint import save_checkpoint

SIZES: Dict[str, Dict[str, int]] = {
    "1m": dict(
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        intermediate_size=512,
        max_position_embeddings=256,
    ),
    "25m": TINY_PRESETS["25m"],
    "100m": dict(
        hidden_size=1024,
        num_layers=8,
        num_heads=16,
        intermediate_size=2816,
        max_position_embeddings=512,
    ),
}
METHODS = ("memory", "checkpoint")


class _WeightsOnlySaver:
    """Stands in for ``Trainer`` in ``TrainerRole._publish``: ``save`` writes checkpoint
    ``step`` with the project's ``save_checkpoint``, weights only (see module docstring)."""

    def __init__(self, job_dir: str, model: torch.nn.Module) -> None:
        self.job_dir, self.model, self.step = job_dir, model, 0

    def save(self, final: bool) -> None:
        save_checkpoint(self.job_dir, self.step, self.model, {}, {}, max_to_keep=1)


def _checksum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _engine_checksum(actor: Any) -> float:
    """Runs inside the ``EngineActor``: checksum of the weights the engine now samples with."""
    return _checksum(actor.model.engine.model)


def _sides(method: str, job_dir: str, model: torch.nn.Module, folder: str, threads: int):
    """Synchronizer + engine actors, and the trainer/explorer stand-ins that use them."""
    import ray

    from trinity.runtime.actors import EngineActor
    from trinity.runtime.synchronizer import Synchronizer

    config = SimpleNamespace(
        mode="both",
        checkpoint_job_dir=job_dir,
        synchronizer=SimpleNamespace(sync_method=method, sync_timeout=600.0),
        trainer=SimpleNamespace(cpu_ranks=1),  # one trainer process
        explorer=SimpleNamespace(rollout_model=SimpleNamespace(engine_type="transformers")),
    )
    sync = ray.remote(num_cpus=0)(Synchronizer).remote(method, job_dir, 600.0, has_trainer=True)
    engine = EngineActor.remote(
        "transformers",
        [],
        job_dir,
        "bench_engine",
        "INFO",
        threads,
        model_path=folder,
        max_model_len=64,
        max_prompt_tokens=None,
        max_response_tokens=8,
    )
    trainer = SimpleNamespace(
        config=config, sync_actor=sync, trainer=_WeightsOnlySaver(job_dir, model)
    )
    from trinity.runtime.explorer_role import ExplorerRole
    from trinity.utils.status import Reporter

    explorer = SimpleNamespace(
        config=config,
        sync_actor=sync,
        engines=[engine],
        loaded_version=0,
        report=Reporter(None, "explorer"),
    )
    wait, releases, load = (
        ExplorerRole._wait_for_trainer,
        ExplorerRole._releases,
        ExplorerRole._load_into,
    )
    explorer._wait_for_trainer = lambda version: wait(explorer, version)
    explorer._releases = lambda version: releases(explorer, version)
    explorer._load_into = lambda engines, weights, version: load(
        explorer, engines, weights, version
    )
    return trainer, explorer, [sync, engine]


def bench_method(method: str, folder: str, model: torch.nn.Module, args: argparse.Namespace):
    """Warm-up round plus ``repeats`` timed rounds of one sync method; medians in seconds."""
    import ray

    from trinity.runtime.explorer_role import ExplorerRole
    from trinity.runtime.trainer_role import TrainerRole

    publish = TrainerRole._publish
    receive = ExplorerRole._sync
    job_dir = tempfile.mkdtemp(prefix=f"sync-{method}-", dir=args.work_dir)
    trainer, explorer, actors = _sides(method, job_dir, model, folder, args.threads)
    rounds: List[Dict[str, float]] = []
    try:
        for version in range(1, args.repeats + 2):
            trainer.trainer.step = version
            start = time.perf_counter()
            publish(trainer, version, model)
            published = time.perf_counter()
            got = receive(explorer, Wanted(version))
            done = time.perf_counter()
            if version > 1 and got == version:  # round 1 is the warm-up
                rounds.append({"publish_s": published - start, "receive_s": done - published})
        engine_sum = ray.get(actors[1].__ray_call__.remote(_engine_checksum))
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        shutil.rmtree(job_dir, ignore_errors=True)
    result = {key: statistics.median(r[key] for r in rounds) for key in ("publish_s", "receive_s")}
    result["total_s"] = result["publish_s"] + result["receive_s"]
    result["best_total_s"] = min(r["publish_s"] + r["receive_s"] for r in rounds)
    result["rounds"] = rounds
    result["weights_match"] = len(rounds) == args.repeats and abs(
        engine_sum - _checksum(model)
    ) <= 1e-6 * max(1.0, abs(engine_sum))
    return result


def bench_size(size: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Build (or reuse) the engine's model folder, make the trainer's model, time each method."""
    from transformers import AutoConfig, LlamaForCausalLM

    folder = build_tiny_model(os.path.join(args.cache_dir, f"sync-{size}"), **SIZES[size])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)  # differs from the folder's seed 0: every sync changes weights
        model = LlamaForCausalLM(AutoConfig.from_pretrained(folder))
    state = model.state_dict()
    out = {
        "size": size,
        "config": SIZES[size],
        "parameters": sum(p.numel() for p in model.parameters()),
        "state_dict_bytes": sum(t.numel() * t.element_size() for t in state.values()),
    }
    for method in args.method:
        out[method] = bench_method(method, folder, model, args)
    return out


def summary(report: Dict[str, Any]) -> str:
    """One line: total seconds per method per size, and checkpoint/memory ratios."""
    parts = []
    for r in report["results"]:
        times = " ".join(f"{m} {r[m]['total_s']:.3f}s" for m in METHODS if m in r)
        if all(m in r for m in METHODS):
            times += (
                f" (checkpoint/memory {r['checkpoint']['total_s'] / r['memory']['total_s']:.2f}x)"
            )
        parts.append(f"{r['size']} ({r['parameters'] / 1e6:.1f}M): {times}")
    c = report["config"]
    return f"sync, median of {c['repeats']}, {c['threads']} engine thread(s): " + "; ".join(parts)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", action="append", choices=list(SIZES))
    parser.add_argument("--method", action="append", choices=list(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--out", default="sync.json")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "trinity-bench-models")
    )
    parser.add_argument("--work-dir", default=None, help="checkpoints go here (default: tmp)")
    args = parser.parse_args(argv)
    args.size = args.size or list(SIZES)
    args.method = args.method or list(METHODS)
    return args


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the benchmark (joining a running local Ray or starting one), write the JSON
    report to ``--out``, print the summary line; return the report."""
    import ray

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, namespace="trinity-bench")
    try:
        results = [bench_size(size, args) for size in args.size]
    finally:
        if started:
            ray.shutdown()
    report = {
        "benchmark": "sync",
        "config": {
            "repeats": args.repeats,
            "threads": args.threads,
            "torch": torch.__version__,
            "ray": ray.__version__,
            "machine": f"{os.cpu_count()} cpus",
        },
        "results": results,
    }
    report["summary"] = summary(report)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
