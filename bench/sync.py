"""Weight-sync seconds by model size, for the ``memory``, ``checkpoint`` and ``nccl`` methods.

Each round runs the project's own code: ``TrainerRole._publish`` on the trainer side and
``ExplorerRole._sync`` on the explorer side (on role objects that carry only the attributes
those methods read), a real ``Synchronizer`` actor between them and a real ``EngineActor``
(a ``TransformersEngine``) receiving the weights in its own process:

- ``memory``: detach-and-clone the state dict, ``ray.put`` it, publish the ref; the engine
  actor gets the dict from the object store and ``load_state_dict`` copies it in.
- ``checkpoint``: ``save_checkpoint`` writes the weights (``actor/model.safetensors``; no
  optimizer state, see below), the path is published; the engine reads it and copies it in.
- ``nccl``: the trainer publishes its offer and broadcasts the weights (gloo on CPU) while
  the engine joins the group, loads each bucket and checks the trainer's checksums
  (``common/weight_transfer.py``).
- ``memory_in_process``: ``memory`` as a stage ``trinity run`` runs in its own process does
  it (no Ray: a ``LocalEngine`` and the synchronizer on a loop of its own, a clone of the
  state dict handed over).
- ``nccl_in_process``: ``nccl`` as such a stage does it on CPU: the same broadcast, the
  engine's rank a thread of this process.

The trainer publishes in a thread while the explorer waits for the version, as in a run
(``nccl``'s broadcast needs both sides at once). ``publish_s`` is the trainer's share (until
``_publish`` returns), ``receive_s`` the explorer's after that (until every engine holds the
new version), ``total_s`` their sum, the sync's wall time; each is the median over
``--repeats`` rounds after one warm-up round, and ``best_total_s`` is the fastest round. The
real ``Trainer.save`` also writes the AdamW state (about twice the weights) in the
checkpoint call; that is left out here so the methods move the same bytes. The trainer's
model is a fresh random init, different from the engine's, so every round copies real new
values; ``weights_match`` records that the engine ended up with them. It measures; it
asserts nothing.

Sizes (character vocabulary of 100 tokens, tied embeddings, Llama blocks)::

    1m:   hidden 128,  4 layers,  4 heads, MLP 512   ->   1.06M parameters
    25m:  the "25m" tiny preset (512, 8, 8, 1408)    ->  25.8M
    100m: hidden 1024, 8 layers, 16 heads, MLP 2816  -> 102.9M
    smollm2: SmolLM2-135M-Instruct's architecture    -> 134.5M (the folder --smollm2 names,
             made by ``trinity prepare-quickstart --task smollm2``; not in the default sizes)

Usage::

    python bench/sync.py --out sync.json
    python bench/sync.py --size smollm2 --smollm2 /tmp/smollm2/model \
        --method memory --method nccl --method memory_in_process --method nccl_in_process \
        --out sync.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch

from trinity.common.sync_schedule import Wanted
from trinity.common.weight_transfer import BUCKET_BYTES
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
METHODS = ("memory", "checkpoint", "nccl", "memory_in_process", "nccl_in_process")
IN_PROCESS = "_in_process"  # the suffix of a method run as a one-process stage runs it
DEFAULT_METHODS = ("memory", "checkpoint", "nccl")
SMOLLM2 = "smollm2"  # a size whose folder --smollm2 names


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


def _config(method: str, job_dir: str) -> SimpleNamespace:
    """What ``_publish``, ``_sync`` and ``weight_sender`` read of a run's config."""
    return SimpleNamespace(
        mode="both",
        checkpoint_job_dir=job_dir,
        synchronizer=SimpleNamespace(sync_method=method, sync_timeout=600.0, sync_style="fixed"),
        trainer=SimpleNamespace(cpu_ranks=1),  # one trainer process
        cluster=SimpleNamespace(gpu_per_node=0),
        model=SimpleNamespace(lora_configs=[], tinker=SimpleNamespace(enable=False)),
        explorer=SimpleNamespace(
            rollout_model=SimpleNamespace(engine_type="transformers", engine_num=1, dtype="float32")
        ),
    )


def _engine(method: str, job_dir: str, folder: str, threads: int) -> Any:
    """The engine: an ``EngineActor`` in its own process, or for the ``*_in_process`` methods
    a ``LocalEngine`` in this one."""
    limits = dict(
        model_path=folder, max_model_len=64, max_prompt_tokens=None, max_response_tokens=8
    )
    if method.endswith(IN_PROCESS):
        from trinity.engine.local import LocalEngine

        return LocalEngine("transformers", name="bench_engine", num_threads=threads, **limits)
    from trinity.runtime.actors import EngineActor

    return EngineActor.remote(
        "transformers", [], job_dir, "bench_engine", "INFO", threads, **limits
    )


def _sides(method: str, job_dir: str, model: torch.nn.Module, folder: str, threads: int):
    """Synchronizer + engine, and the trainer and explorer roles that use them."""
    import ray

    from trinity.runtime.explorer_role import ExplorerRole
    from trinity.runtime.synchronizer import Synchronizer
    from trinity.runtime.trainer_role import TrainerRole, weight_sender
    from trinity.utils.loop_host import LoopHost
    from trinity.utils.status import Reporter

    config = _config(method, job_dir)
    transport = method.removesuffix(IN_PROCESS)
    config.synchronizer.sync_method = transport
    if method.endswith(IN_PROCESS):
        sync = LoopHost(lambda: Synchronizer(transport, job_dir, 600.0, True), "bench_sync")
    else:
        sync = ray.remote(num_cpus=0)(Synchronizer).remote(transport, job_dir, 600.0, True)
    engine = _engine(method, job_dir, folder, threads)
    trainer = TrainerRole.__new__(TrainerRole)
    trainer.config, trainer.sync_actor = config, sync
    trainer.trainer, trainer.report = _WeightsOnlySaver(job_dir, model), Reporter(None, "trainer")
    trainer.sender = weight_sender(config) if transport == "nccl" else None
    trainer.published, trainer.unsent, trainer.running = None, None, True
    explorer = ExplorerRole.__new__(ExplorerRole)
    explorer.config, explorer.sync_actor, explorer.engines = config, sync, [engine]
    explorer.loaded_version, explorer.report = 0, Reporter(None, "explorer")
    return trainer, explorer, [sync, engine]


def _round(trainer: Any, explorer: Any, version: int, model: torch.nn.Module) -> Dict[str, float]:
    """One sync of ``version``: the trainer publishes in a thread while the explorer waits
    for it and loads it, as in a run."""
    from trinity.runtime.explorer_role import ExplorerRole
    from trinity.runtime.trainer_role import TrainerRole

    trainer.trainer.step = version
    times: Dict[str, float] = {}

    def publish() -> None:
        TrainerRole._publish(trainer, version, model)
        times["published"] = time.perf_counter()

    thread = threading.Thread(target=publish)
    start = time.perf_counter()
    thread.start()
    got = ExplorerRole._sync(explorer, Wanted(version))
    done = time.perf_counter()
    thread.join()
    if got != version or "published" not in times:
        raise RuntimeError(f"round {version} did not sync (the explorer holds {got})")
    publish_s = times["published"] - start
    return {"publish_s": publish_s, "receive_s": max(0.0, done - start - publish_s)}


def _close(actors: List[Any]) -> None:
    import ray

    for actor in actors:
        if hasattr(actor, "close"):  # a LoopHost of this process
            actor.close()
        else:
            ray.kill(actor, no_restart=True)


def _engine_sum(engine: Any) -> float:
    import ray

    if hasattr(engine, "hosted"):
        return _checksum(engine.hosted.engine.model)
    return ray.get(engine.__ray_call__.remote(_engine_checksum))


def bench_method(method: str, folder: str, model: torch.nn.Module, args: argparse.Namespace):
    """Warm-up round plus ``repeats`` timed rounds of one sync method; medians in seconds."""
    job_dir = tempfile.mkdtemp(prefix=f"sync-{method}-", dir=args.work_dir)
    trainer, explorer, actors = _sides(method, job_dir, model, folder, args.threads)
    rounds: List[Dict[str, float]] = []
    try:
        for version in range(1, args.repeats + 2):
            timing = _round(trainer, explorer, version, model)
            if version > 1:  # round 1 is the warm-up
                rounds.append(timing)
        engine_sum = _engine_sum(actors[1])
    finally:
        _close(actors)
        shutil.rmtree(job_dir, ignore_errors=True)
    result = {key: statistics.median(r[key] for r in rounds) for key in ("publish_s", "receive_s")}
    result["total_s"] = result["publish_s"] + result["receive_s"]
    result["best_total_s"] = min(r["publish_s"] + r["receive_s"] for r in rounds)
    result["rounds"] = rounds
    result["weights_match"] = len(rounds) == args.repeats and abs(
        engine_sum - _checksum(model)
    ) <= 1e-6 * max(1.0, abs(engine_sum))
    return result


def _folder(size: str, args: argparse.Namespace) -> str:
    if size == SMOLLM2:
        if not args.smollm2 or not os.path.isfile(os.path.join(args.smollm2, "config.json")):
            raise SystemExit(
                "--size smollm2 needs --smollm2 <folder>: make it with "
                "`trinity prepare-quickstart --task smollm2 --out <dir>` (<dir>/model)"
            )
        return args.smollm2
    return build_tiny_model(os.path.join(args.cache_dir, f"sync-{size}"), **SIZES[size])


def bench_size(size: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Build (or reuse) the engine's model folder, make the trainer's model, time each method."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = _folder(size, args)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)  # differs from the folder's weights: every sync changes them
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(folder), dtype=torch.float32
        )
    state = model.state_dict()
    out = {
        "size": size,
        "config": SIZES.get(size, {"model": os.path.basename(os.path.normpath(folder))}),
        "parameters": sum(p.numel() for p in model.parameters()),
        "state_dict_bytes": sum(t.numel() * t.element_size() for t in state.values()),
    }
    for method in args.method:
        out[method] = bench_method(method, folder, model, args)
    return out


def summary(report: Dict[str, Any]) -> str:
    """One line: total seconds per method per size, and each method against memory."""
    parts = []
    for r in report["results"]:
        times = " ".join(f"{m} {r[m]['total_s']:.3f}s" for m in METHODS if m in r)
        ratios = [
            f"{m}/memory {r[m]['total_s'] / r['memory']['total_s']:.2f}x"
            for m in METHODS[1:]
            if m in r and "memory" in r
        ]
        times += f" ({', '.join(ratios)})" if ratios else ""
        parts.append(f"{r['size']} ({r['parameters'] / 1e6:.1f}M): {times}")
    c = report["config"]
    return f"sync, median of {c['repeats']}, {c['threads']} engine thread(s): " + "; ".join(parts)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", action="append", choices=[*SIZES, SMOLLM2])
    parser.add_argument("--method", action="append", choices=list(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--smollm2", default=None, help="SmolLM2-135M-Instruct's folder")
    parser.add_argument("--out", default="sync.json")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "trinity-bench-models")
    )
    parser.add_argument("--work-dir", default=None, help="checkpoints go here (default: tmp)")
    args = parser.parse_args(argv)
    args.size = args.size or list(SIZES)
    args.method = args.method or list(DEFAULT_METHODS)
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
            "bucket_bytes": BUCKET_BYTES,
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
