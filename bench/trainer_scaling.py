"""Trainer tokens/s and memory per rank with 1 and 2 trainer ranks (``trainer.cpu_ranks``).

Workload: SFT steps (``algorithm_type: sft``: the actor only, no reference, no advantages)
on fixed batches of ``--rows`` rows of ``--prompt-tokens`` + ``--response-tokens`` random
token ids, the same batches for both sides, one micro-batch size per rank. SFT is the
simplest step that exercises the whole sharded path (split rows, FSDP2 forward/backward,
summed gradients, clipped AdamW update) without a second model's memory in the figures.

Each side runs its ranks as spawned processes, as ``trinity run`` does with Ray actors
(``runtime/trainer_ranks.py``): 1 rank is the plain ``Trainer`` (what ``cpu_ranks: 1``
runs), 2 ranks are ``ShardedTrainer``s in one gloo group. Each rank gets ``cores // ranks``
torch threads (``runtime/actors.py: compute_threads`` in train mode), so both sides use the
same cores: on a 2-core machine the 2 ranks share them, one thread each. A third side, one
rank with the 2-rank side's threads per rank, separates what the split buys from what
threading does. The sides alternate, ``--repeats`` rounds each, so a busy spell of other
processes hits all of them; each round records the load average before it.

Per side: tokens/s over ``--steps`` steps after one warm-up step (every token of the batch,
prompt and response, goes through forward and backward), the loss of each step (equal on
both sides: the same update). Per rank: peak RSS at start-up (loading and sharding) and
while training after the warm-up (``VmHWM`` of /proc/self/status, reset between phases
through /proc/self/clear_refs; ``ru_maxrss`` where that is missing), and the bytes of the
tensors the rank holds: its parameter shards, gradient shards and AdamW state
(``DTensor.to_local()``). ``--malloc-mmap-threshold`` fixes glibc's mmap threshold in the
ranks so that freed tensors leave RSS (the default allocator keeps many of them). It
measures; it asserts nothing.

Usage::

    python -m bench.trainer_scaling --out docs/results/trainer_scaling.json
    python -m bench.trainer_scaling --malloc-mmap-threshold 131072 --out mmap.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import textwrap
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from trinity.preflight.derive import finalize

CONFIG = """
project: bench
cluster: {{gpu_per_node: 0}}  # CPU ranks, also on a machine with a GPU
name: trainer_scaling_{ranks}
checkpoint_root_dir: {root}
mode: train
continue_from_checkpoint: false
model: {{model_path: {model}, max_prompt_tokens: {prompt}, max_response_tokens: {response}}}
algorithm: {{algorithm_type: sft, optimizer: {{lr: 0.0001}}}}
buffer:
  train_batch_size: {rows}
  total_steps: {steps}
  trainer_input:
    experience_buffer:
      name: unused
      storage_type: file
      path: {root}/unused
      format: {{prompt_key: prompt, response_key: response}}
trainer:
  cpu_ranks: {ranks}
  use_dynamic_bsz: false
  trainer_config: {{actor_rollout_ref: {{actor: {{ppo_micro_batch_size_per_gpu: {micro}}}}}}}
"""

STARTUP_NOTE = (
    "each rank loads the whole model (from_pretrained) before fully_shard keeps its shard, so "
    "start_up_peak_rss_mb holds a whole copy of the weights on every rank; rank 0 also holds "
    "a whole CPU copy while it publishes, saves model.safetensors or exports hf/ (not measured "
    "here: no sync or save in this loop)"
)


# ---- memory --------------------------------------------------------------------------------


def _status_mb(field: str) -> Optional[float]:
    """A ``Vm*`` line of /proc/self/status in MB (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Set the peak RSS (VmHWM) back to the current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb() -> float:
    """Peak RSS since the last reset (or since the process started) in MB."""
    peak = _status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _local_bytes(tensors: Iterable[Any]) -> int:
    """Bytes this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    total = 0
    for tensor in tensors:
        if tensor is None or not isinstance(tensor, torch.Tensor):
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _held_bytes(trainer: Any) -> Dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state."""
    params = list(trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values()]
    return {
        "param_bytes": _local_bytes(params),
        "grad_bytes": _local_bytes(p.grad for p in params),
        "optimizer_state_bytes": _local_bytes(state),
    }


# ---- one rank ------------------------------------------------------------------------------


def _experiences(rows: int, prompt: int, response: int, tokenizer: Any, seed: int) -> List[Any]:
    """``rows`` fixed-length rows of random ordinary token ids (no special token)."""
    from trinity.common.experience import Experience

    generator = torch.Generator().manual_seed(seed)
    low = max(tokenizer.all_special_ids) + 1
    tokens = torch.randint(low, len(tokenizer), (rows, prompt + response), generator=generator)
    return [Experience(row, prompt) for row in tokens]


def _train(trainer: Any, batch: List[Any], steps: int) -> Dict[str, Any]:
    """One warm-up step, then ``steps`` timed steps; per-step seconds and metrics."""
    trainer.step = 1
    trainer.train_step(batch)
    reset = _reset_peak()
    seconds, losses, norms = [], [], []
    start = time.perf_counter()
    for step in range(2, steps + 2):
        trainer.step = step
        began = time.perf_counter()
        metrics = trainer.train_step(batch)
        seconds.append(time.perf_counter() - began)
        losses.append(metrics["actor/sft_loss"])
        norms.append(metrics["actor/grad_norm"])
    return {
        "wall_s": time.perf_counter() - start,
        "step_seconds": seconds,
        "sft_loss": losses,
        "grad_norm": norms,
        "training_peak_rss_mb": _peak_mb(),
        "training_peak_is_since_warm_up": reset,
    }


def _rank_main(rank: int, world: int, port: int, setup: Dict[str, Any]) -> None:
    """One rank of a side (spawned): load, shard, train; writes ``rank_<rank>.json``."""
    from trinity.common.config import load_config

    threads = setup["threads"]
    torch.set_num_threads(threads)
    config = finalize(load_config(setup["config"]))
    ranks = None
    if world > 1:
        from trinity.trainer.distributed import init_group

        ranks = init_group(rank, world, port, timeout_s=900)
    rss_before = _status_mb("VmRSS")
    _reset_peak()
    trainer = _build(config, setup["steps"] + 1, ranks)
    trainer.prepare_model()
    start_up_peak, rss_prepared = _peak_mb(), _status_mb("VmRSS")
    shape = (setup["rows"], setup["prompt"], setup["response"])
    batch = _experiences(*shape, trainer.tokenizer, setup["seed"])
    result = {"rank": rank, "threads": threads, "rss_mb_before_model": rss_before}
    result["gradient_checkpointing"] = trainer.settings["enable_gradient_checkpointing"]
    result.update(start_up_peak_rss_mb=start_up_peak, rss_mb_after_prepare=rss_prepared)
    result.update(_train(trainer, batch, setup["steps"]))
    result.update(_held_bytes(trainer), rss_mb_end=_status_mb("VmRSS"))
    result["tokens_per_step"] = setup["rows"] * (setup["prompt"] + setup["response"])
    with open(os.path.join(setup["out_dir"], f"rank_{rank}.json"), "w") as f:
        json.dump(result, f)
    if ranks is not None:
        from trinity.trainer.distributed import close_group

        close_group()


def _build(config: Any, planned_steps: int, ranks: Any) -> Any:
    """The trainer ``cpu_ranks`` selects: ``Trainer`` alone, ``ShardedTrainer`` in a group."""
    from trinity.trainer.sharded import ShardedTrainer
    from trinity.trainer.trainer import Trainer

    def log(metrics: Dict[str, float], step: int) -> None:
        return None

    if ranks is None:
        return Trainer(config, planned_steps, log=log)
    return ShardedTrainer(config, planned_steps, log=log, ranks=ranks)


# ---- a side and the report -----------------------------------------------------------------


def _write_config(root: str, world: int, model: str, args: argparse.Namespace) -> str:
    """The train-mode SFT config of a ``world``-rank side (its data file is never read)."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "config.yaml")
    text = CONFIG.format(
        ranks=world,
        root=root,
        model=model,
        prompt=args.prompt_tokens,
        response=args.response_tokens,
        rows=args.rows,
        steps=args.steps + 1,
        micro=args.micro_batch,
    )
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def _round(
    world: int, threads: int, model: str, root: str, args: argparse.Namespace
) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """Run ``world`` ranks once on the shared workload; tokens/s and each rank's figures."""
    import torch.multiprocessing as mp

    from trinity.trainer.distributed import free_port

    setup = {"config": _write_config(root, world, model, args), "out_dir": root}
    setup.update(threads=threads, seed=args.seed, steps=args.steps)
    setup.update(rows=args.rows, prompt=args.prompt_tokens, response=args.response_tokens)
    load = os.getloadavg()[0]
    mp.spawn(_rank_main, args=(world, free_port(), setup), nprocs=world)
    ranks = []
    for rank in range(world):
        with open(os.path.join(root, f"rank_{rank}.json")) as f:
            ranks.append(json.load(f))
    wall = max(r["wall_s"] for r in ranks)  # the ranks wait for each other every step
    tokens = ranks[0]["tokens_per_step"] * args.steps
    return {"tokens_per_s": tokens / wall, "seconds": wall, "load_avg_1m_before": load}, ranks


def _side(rounds: List[Any], world: int) -> Dict[str, Any]:
    """A side's rounds: tokens/s best and median; the last round's ranks in full."""
    speeds = [r["tokens_per_s"] for r, _ in rounds]
    ranks = rounds[-1][1]
    return {
        "ranks": world,
        "threads_per_rank": ranks[0]["threads"],
        "tokens_per_step": ranks[0]["tokens_per_step"],
        "tokens_per_s_best": max(speeds),
        "tokens_per_s_median": statistics.median(speeds),
        "rounds": [r for r, _ in rounds],
        "sft_loss": ranks[0]["sft_loss"],
        "grad_norm": ranks[0]["grad_norm"],
        "per_rank": ranks,
    }


def _sides(cores: int) -> Dict[str, Tuple[int, int]]:
    """Side name -> (ranks, threads per rank): 1 and 2 ranks on the same cores, and 1 rank
    with the 2-rank side's threads per rank (what the split itself buys)."""
    half = max(1, cores // 2)
    sides = {"one_rank": (1, cores), "two_ranks": (2, half)}
    if half != cores:
        sides["one_rank_same_threads"] = (1, half)
    return sides


def _run(model: str, args: argparse.Namespace) -> Dict[str, Dict[str, Any]]:
    """Every side, ``--repeats`` rounds each, alternated so a busy spell hits all sides."""
    sides = _sides(args.cores)
    rounds: Dict[str, List[Any]] = {name: [] for name in sides}
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if args.malloc_mmap_threshold:  # read by glibc when each spawned rank starts
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    try:
        with tempfile.TemporaryDirectory(prefix="trainer-scaling-") as work:
            for index in range(args.repeats):
                for name, (world, threads) in sides.items():
                    root = os.path.join(work, f"{name}_{index}")
                    rounds[name].append(_round(world, threads, model, root, args))
    finally:
        if args.malloc_mmap_threshold:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_")
            if saved is not None:
                os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return {name: _side(rounds[name], sides[name][0]) for name in sides}


def _most(side: Dict[str, Any], key: str) -> float:
    return max(r[key] for r in side["per_rank"])


def _ratios(one: Dict[str, Any], two: Dict[str, Any]) -> Dict[str, float]:
    """2-rank figure / 1-rank figure; memory figures per rank (the larger of the 2 ranks)."""

    def held(side: Dict[str, Any]) -> float:
        return _most(side, "param_bytes") + _most(side, "optimizer_state_bytes")

    out = {key: two[key] / one[key] for key in ("tokens_per_s_best", "tokens_per_s_median")}
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        out[f"per_rank_{key}"] = _most(two, key) / _most(one, key)
    out["per_rank_param_plus_optimizer_bytes"] = held(two) / held(one)
    for key in ("start_up_peak_rss_mb", "training_peak_rss_mb"):
        out[f"per_rank_{key}"] = _most(two, key) / _most(one, key)
    return out


def _gpu_note() -> str:
    if torch.cuda.is_available():
        return "a GPU is visible but trainer ranks on GPUs are not supported yet: not measured"
    return "no GPU on this machine: not measured"


def _notes(args: argparse.Namespace) -> Dict[str, str]:
    allocator = (
        f"MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}: every allocation above it is "
        "its own mapping, unmapped when freed, so RSS follows the live tensors"
        if args.malloc_mmap_threshold
        else "glibc's default malloc (what trinity run gets): freed tensors below its dynamic "
        "mmap threshold (up to 32 MB, raised by each freed mapping) stay in the process, so "
        "RSS counts them after they are freed; --malloc-mmap-threshold shows live memory"
    )
    return {
        "cores": f"one_rank and two_ranks use the same {args.cores} core(s) (threads per rank "
        "= cores // ranks, as runtime/actors.py gives a train-mode trainer); "
        "one_rank_same_threads has two_ranks' threads per rank. Other processes on the "
        "machine take cores too (load_avg_1m_before of each round), and a multi-threaded "
        "rank loses most when they do (its threads wait for a descheduled one)",
        "memory": "param/grad/optimizer_state bytes: tensors this rank holds after a step "
        "(local shards); peak RSS: the whole process (Python, torch, gloo, activations, "
        "allocator). " + allocator,
        "workload": "every row has its own random prompt, so the 1-rank trainer's shared-prefix "
        "scoring (rows sharing a prompt, as GRPO groups do; off with several ranks and with "
        "gradient checkpointing) does not apply: both sides compute the same tokens",
        "start_up": STARTUP_NOTE,
        "gpu": _gpu_note(),
    }


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    from trinity.demo.tiny import TINY_PRESETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="25m", choices=sorted(TINY_PRESETS))
    parser.add_argument("--rows", type=int, default=8, help="rows per step (even)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=96)
    parser.add_argument("--micro-batch", type=int, default=2, help="rows per micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after 1 warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds per side")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=0,
        help="bytes; set MALLOC_MMAP_THRESHOLD_ in the ranks (0: glibc's default)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="trainer_scaling.json")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "trinity-bench-models")
    )
    return parser.parse_args(argv)


def _summary(report: Dict[str, Any], args: argparse.Namespace) -> str:
    one, two = report["one_rank"], report["two_ranks"]
    ratios = report["ratios"]["two_ranks_over_one_rank"]
    line = (
        f"trainer on {args.preset}, {args.cores} cores, best of {args.repeats}: 1 rank "
        f"{one['tokens_per_s_best']:.0f} tok/s, 2 ranks {two['tokens_per_s_best']:.0f} tok/s "
        f"(x{ratios['tokens_per_s_best']:.2f}, median x{ratios['tokens_per_s_median']:.2f}"
    )
    same = report["ratios"].get("two_ranks_over_one_rank_same_threads")
    if same is not None:
        line += f"; x{same['tokens_per_s_best']:.2f} over 1 rank with as many threads per rank"
    return line + (
        f"); per rank: params+AdamW state x{ratios['per_rank_param_plus_optimizer_bytes']:.2f}"
        f", training peak RSS x{ratios['per_rank_training_peak_rss_mb']:.2f}, "
        f"start-up peak RSS x{ratios['per_rank_start_up_peak_rss_mb']:.2f}"
    )


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run every side on one workload, write the JSON to ``--out``, print one line."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trinity.demo.tiny import build_tiny_preset

    args = _parse(argv)
    model = build_tiny_preset(os.path.join(args.cache_dir, args.preset), args.preset)
    sides = _run(model, args)
    with torch.device("meta"):
        parameters = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    one, two = sides["one_rank"], sides["two_ranks"]
    report: Dict[str, Any] = {
        "benchmark": "trainer_scaling",
        "config": {
            "preset": args.preset,
            "parameters": sum(p.numel() for p in parameters.parameters()),
            "workload": "sft on fixed random-token rows, the same batch every step",
            "rows_per_step": args.rows,
            "prompt_tokens": args.prompt_tokens,
            "response_tokens": args.response_tokens,
            "micro_batch_rows_per_rank": args.micro_batch,
            "gradient_checkpointing": one["per_rank"][0]["gradient_checkpointing"],
            "steps_timed_after_1_warm_up": args.steps,
            "repeats": args.repeats,
            "cores": args.cores,
            "malloc_mmap_threshold": args.malloc_mmap_threshold or None,
            "dtype": "float32",
            "torch": torch.__version__,
            "machine": f"{os.cpu_count()} cpus, {platform.machine()}",
        },
        "notes": _notes(args),
        **sides,
        "ratios": {"two_ranks_over_one_rank": _ratios(one, two)},
    }
    if "one_rank_same_threads" in sides:
        same = sides["one_rank_same_threads"]
        report["ratios"]["two_ranks_over_one_rank_same_threads"] = {
            key: two[key] / same[key] for key in ("tokens_per_s_best", "tokens_per_s_median")
        }
    report["summary"] = _summary(report, args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
