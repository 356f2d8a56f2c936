"""Weight-sync seconds of a LoRA run (merged adapted layers) next to a full-model sync.

A LoRA trainer's ``memory`` sync sends ``W + scale * B @ A`` of every adapted layer, under
the base model's names (``trinity/trainer/lora.py``: ``sync_state_dict``), computed at each
sync; nothing else changes, so nothing else is sent. This runs the same rounds as
``bench/sync.py`` (``TrainerRole._publish`` -> ``Synchronizer`` -> a real ``EngineActor``
loading the weights in its own process) twice on the 25m preset: the plain model (every
weight) and the same model wrapped with an adapter (``all-linear``, rank 32, alpha 32; B set
to random values so each merge produces new weights). ``merge_s`` is the median time of
``merged_state_dict`` alone, part of ``publish_s``. ``weights_match``: the engine ended up
with exactly the merged weights. It measures; it asserts nothing.

Usage::

    python -m bench.lora_sync --out docs/results/lora_sync.json
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

from bench.sync import SIZES, _sides
from trinity.common.sync_schedule import Wanted
from trinity.demo.tiny import build_tiny_model
from trinity.trainer import lora


def _engine_weights(actor: Any) -> Dict[str, torch.Tensor]:
    """Runs inside the ``EngineActor``: the weights it now samples with."""
    return {k: v.clone() for k, v in actor.model.engine.model.state_dict().items()}


def _rounds(folder: str, model: torch.nn.Module, args: argparse.Namespace) -> Dict[str, Any]:
    """``repeats`` timed ``memory`` rounds (after a warm-up) of ``model``; medians, and
    whether the engine ended up with exactly what ``sync_state_dict`` sends."""
    import ray

    from trinity.runtime.explorer_role import ExplorerRole
    from trinity.runtime.trainer_role import TrainerRole

    publish = TrainerRole._publish
    receive = ExplorerRole._sync
    job_dir = tempfile.mkdtemp(prefix="sync-lora-", dir=args.work_dir)
    trainer, explorer, actors = _sides("memory", job_dir, model, folder, args.threads)
    rounds: List[Dict[str, float]] = []
    try:
        for version in range(1, args.repeats + 2):
            start = time.perf_counter()
            publish(trainer, version, model)
            published = time.perf_counter()
            got = receive(explorer, Wanted(version))
            done = time.perf_counter()
            if version > 1 and got == version:
                rounds.append({"publish_s": published - start, "receive_s": done - published})
        engine = ray.get(actors[1].__ray_call__.remote(_engine_weights))
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        shutil.rmtree(job_dir, ignore_errors=True)
    sent = lora.sync_state_dict(model)
    result = {key: statistics.median(r[key] for r in rounds) for key in ("publish_s", "receive_s")}
    result["total_s"] = result["publish_s"] + result["receive_s"]
    result["sent_bytes"] = sum(t.numel() * t.element_size() for t in sent.values())
    result["sent_tensors"] = len(sent)
    result["rounds"] = rounds
    result["weights_match"] = all(torch.equal(engine[k], v) for k, v in sent.items())
    return result


def _merge_seconds(model: torch.nn.Module, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        lora.merged_state_dict(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _plain(folder: str) -> torch.nn.Module:
    """A random init (seed 1, unlike the engine's folder): every sync changes weights."""
    from transformers import AutoConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return LlamaForCausalLM(AutoConfig.from_pretrained(folder))


def _wrapped(folder: str, rank: int) -> torch.nn.Module:
    """The trainer's model with an adapter whose B is random (a zero B merges to the base)."""
    model = _plain(folder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        entry = SimpleNamespace(
            path=None,
            lora_rank=rank,
            lora_alpha=rank,
            lora_dtype="auto",
            target_modules="all-linear",
            name=None,
        )
        wrapped = lora.wrap(model, entry, folder)
        with torch.no_grad():
            for name, param in wrapped.named_parameters():
                if ".lora_B." in name:
                    param.normal_(0.0, 0.02)
    return wrapped


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run both syncs on the 25m preset, write the JSON report to ``--out``, print a line."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="25m", choices=list(SIZES))
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--out", default="lora_sync.json")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "trinity-bench-models")
    )
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = build_tiny_model(os.path.join(args.cache_dir, f"sync-{args.size}"), **SIZES[args.size])
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, namespace="trinity-bench")
    try:
        wrapped = _wrapped(folder, args.rank)
        trainable, total = wrapped.get_nb_trainable_parameters()
        lora_result = _rounds(folder, wrapped, args)
        lora_result["merge_s"] = _merge_seconds(wrapped, args.repeats)
        full = _rounds(folder, _plain(folder), args)
    finally:
        if started:
            ray.shutdown()
    report = {
        "benchmark": "lora_sync",
        "config": {
            "size": args.size,
            "rank": args.rank,
            "repeats": args.repeats,
            "threads": args.threads,
            "parameters": total,
            "adapter_parameters": trainable,
            "torch": torch.__version__,
            "machine": f"{os.cpu_count()} cpus",
        },
        "lora_merged": lora_result,
        "full_model": full,
    }
    report["summary"] = (
        f"memory sync on {args.size}, median of {args.repeats}: LoRA merged layers "
        f"{lora_result['total_s']:.3f}s (merge {lora_result['merge_s']:.3f}s, "
        f"{lora_result['sent_bytes'] / 1e6:.0f} MB) vs full model {full['total_s']:.3f}s "
        f"({full['sent_bytes'] / 1e6:.0f} MB)"
    )
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
