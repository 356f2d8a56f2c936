"""GPU check: a colocated GRPO stage on a Qwen2-0.5B-shaped model, in one process, no Ray.

    python bench/gpu_check.py         # on a GPU: docs/results/gpu_check_<card>.json
    python bench/gpu_check.py --preset micro --device cpu --out /tmp/check.json  # CPU seam

Nothing is downloaded: the model is built from its shape with random weights (a Llama with
Qwen2-0.5B's widths, depth, grouped-query heads, projection biases, tied embeddings and a
151,936-token vocabulary, the character tokenizer padded to it) and the data is generated
arithmetic. Random weights rarely sample the end token, so responses run to
``max_response_tokens``: every step does the same work, which is what a throughput figure
wants (the rewards, all 0, are not the point). Reported:

- ``trainer``: MFU of the train step in bf16 = tokens/s x 6 x parameters / the card's peak
  dense bf16 FLOP/s (attention's quadratic FLOPs and the reference model's forward are not
  counted, so this understates the work done), its tokens/s and peak memory;
- ``engine``: the rollout engine's tokens/s with each decoder (``auto``; ``static``; on CUDA
  ``graphs``, its steps replayed as CUDA graphs) against plain ``model.generate`` on the same
  card, prompts, samples and lengths, at each of ``--batches`` rows (best of a few timed
  calls after a warm-up), and its peak memory (``gpu_figures.py``);
- ``logprobs``: engine (bf16 weights) against trainer (fp32 weights under bf16 autocast) on
  each decoder's samples, and each stage's ``actor/ppo_kl`` at step 1;
- ``sync``: seconds to hand weights over (the trainer's publish, the engine's load, and the
  engine's release and reload of its weights while the trainer steps);
- ``stages``: per rollout decoder (the default engine; on CUDA also ``graphs``, through the
  engine registered below), steps, wall time, explore step against train step;
- ``unit_tier``: on CUDA, the ``gpu``-marked unit tests' outcome (a failing run keeps the
  end of pytest's output, short tracebacks included).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu_figures import engine_figures, peak_gb, reset_peak  # noqa: E402
from trinity.demo.synthetic import make_arithmetic  # noqa: E402
from trinity.demo.tiny import TINY_PRESETS, build_tiny_model  # noqa: E402
from trinity.engine import ENGINES  # noqa: E402
from trinity.engine.transformers_model import TransformersInferenceModel  # noqa: E402


class GraphsEngine(TransformersInferenceModel):
    """The built-in engine decoding with CUDA graphs, for the stage: no YAML key selects
    them before this check has measured them on a GPU (docs/design-notes.md). Registered
    by ``main`` on CUDA only, as ``transformers_graphs``."""

    @staticmethod
    def build_engine(**engine_kwargs: Any) -> Any:
        from trinity.engine.hf_engine import TransformersEngine

        return TransformersEngine(**engine_kwargs, decoder="graphs")


# Qwen2-0.5B's config.json, as build_tiny_model takes it.
SHAPES: Dict[str, Dict[str, Any]] = {
    "qwen2-0.5b": dict(
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=4096,
        attention_bias=True,
        vocab_size=151936,
    ),
    "micro": dict(TINY_PRESETS["micro"], num_kv_heads=2, attention_bias=True, vocab_size=512),
    # the micro model with Qwen2's vocabulary: the logits' memory and time dominate, on CPU
    "micro-vocab": dict(TINY_PRESETS["micro"], num_kv_heads=2, vocab_size=151936),
}

# algorithm.rollout_correction of the stage with --rollout-correction (veRL's key names)
CORRECTION = {
    "rollout_is": "token",
    "rollout_is_threshold": 2.0,
    "rollout_rs": "token",
    "rollout_rs_threshold": 2.0,
    "rollout_rs_threshold_lower": 0.5,
}

# Peak dense bf16 FLOP/s by the card's name (NVIDIA's data sheets, without sparsity).
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def peak_flops(name: str) -> float:
    """The card's peak dense bf16 FLOP/s, matched on its name (0 when unknown)."""
    return next((flops for key, flops in PEAK_BF16.items() if key in name), 0.0)


def stage_config(root: str, model: str, data: Dict[str, str], engine: str, args: Any) -> str:
    """A colocated GRPO stage over the generated data, sampled by ``engine`` (an
    ``engine_type``); returns the YAML's path."""
    precision = {"mixed_precision": {"param_dtype": args.param_dtype}} if args.param_dtype else {}
    arr = {
        "model": {"enable_gradient_checkpointing": False},
        "actor": {"ppo_max_token_len_per_gpu": args.max_tokens_per_pass, "fsdp_config": precision},
        "ref": {
            "log_prob_max_token_len_per_gpu": args.max_tokens_per_pass,
            "fsdp_config": precision,
        },
    }
    config = {
        "project": "gpu_check",
        "name": f"grpo_{engine}",
        "mode": "colocate",
        "checkpoint_root_dir": os.path.join(root, "checkpoints"),
        "continue_from_checkpoint": False,
        "model": {
            "model_path": model,
            "max_prompt_tokens": 32,
            "max_response_tokens": args.response_tokens,
        },
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": args.repeat,
            # token-level truncated IS and a ratio band: the bf16 engine's logprobs differ
            **({"rollout_correction": CORRECTION} if args.rollout_correction else {}),
        },
        "buffer": {
            "batch_size": args.tasks,
            "total_steps": args.steps,
            "explorer_input": {
                "default_workflow_type": "math_workflow",
                "taskset": {
                    "name": "arithmetic",
                    "path": os.path.dirname(data["train"]),
                    "split": "train",
                    "format": {"prompt_key": "question", "response_key": "answer"},
                    "rollout_args": {"temperature": 1.0},
                },
            },
        },
        # every task of a step in flight at once: one engine batch per step
        "explorer": {
            "runner_per_model": 4,
            "concurrent_mode": "multi-threading",
            "rollout_model": {"engine_type": engine},
        },
        "trainer": {
            "save_interval": 0,
            "save_hf_checkpoint": "never",
            "trainer_config": {"actor_rollout_ref": arr},
        },
    }
    path = os.path.join(root, f"grpo_{engine}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def read_metrics(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_stage(root: str, model: str, engine: str, args: Any) -> Dict[str, Any]:
    """``trinity run`` of the colocated stage (its own process is this one); its figures."""
    from trinity.runtime.launcher import run

    data = make_arithmetic(
        os.path.join(root, "data"), n_train=args.tasks * args.steps, n_test=8, digits=2
    )
    start = time.monotonic()
    # DEBUG: the engine logs each batch it generates, so its share of a step can be read
    results = run(stage_config(root, model, data, engine, args), ["log.level=DEBUG"], [])
    wall = time.monotonic() - start
    monitor = os.path.join(results[0].job_dir, "monitor")
    trainer = read_metrics(os.path.join(monitor, "trainer.jsonl"))
    explorer = read_metrics(os.path.join(monitor, "explorer.jsonl"))
    with open(os.path.join(results[0].job_dir, "log", "explorer_engine_0.log")) as f:
        batches = [
            (int(m[1]), float(m[2]))
            for m in re.finditer(
                r"generated \d+ request\(s\), (\d+) row\(s\) in ([\d.]+)s", f.read()
            )
        ]
    return {"wall_s": wall, "trainer": trainer, "explorer": explorer, "engine_batches": batches}


def summarize_stage(stage: Dict[str, Any], params: int, peak: float) -> Dict[str, Any]:
    """Trainer figures of the stage's steps after the first (the first warms kernels up)."""
    steps = stage["trainer"][1:] or stage["trainer"]
    if not steps:
        return {"finished": False, "wall_s": stage["wall_s"]}
    rate = statistics.median(s["perf/throughput"] for s in steps)
    first = stage["trainer"][0]
    explored = stage["explorer"][1:] or stage["explorer"]
    return {
        "finished": True,
        "steps": len(stage["trainer"]),
        "wall_s": stage["wall_s"],
        "trainer": {
            "tokens_per_step": statistics.median(s["perf/total_num_tokens"] for s in steps),
            "train_step_s": statistics.median(s["time/train_step"] for s in steps),
            "tokens_per_s": rate,
            "mfu": rate * 6 * params / peak if peak else None,
            "peak_memory_gb": max(s.get("perf/max_memory_allocated_gb", 0.0) for s in steps),
            "publish_s": statistics.median(s.get("time/sync_weights", 0.0) for s in steps),
        },
        "explorer": {
            "explore_step_s": statistics.median(s["time/explore_step"] for s in explored),
            "wait_for_weights_s": statistics.median(s["time/wait_for_weights"] for s in explored),
        },
        "engine_batches": {  # every generate call of the stage: (rows, seconds)
            "count": len(stage["engine_batches"]),
            "rows": [rows for rows, _ in stage["engine_batches"]],
            "seconds": [round(sec, 3) for _, sec in stage["engine_batches"]],
        },
        "actor_ppo_kl_step1": first.get("actor/ppo_kl"),
        # engine against trainer logprobs (logged every step) and the correction's figures
        "rollout_corr_step1": {k: v for k, v in first.items() if k.startswith("rollout_corr/")},
    }


def write_report(report: Dict[str, Any], out: str, start: float) -> None:
    report["total_s"] = time.monotonic() - start
    with open(out, "w") as f:
        json.dump(report, f, indent=2)


def unit_tier(timeout_s: int) -> Dict[str, Any]:
    """The ``gpu``-marked unit tests (the CUDA graphs, the engine on CUDA). Only the modules
    that hold some are collected: the others import what a bare GPU machine may lack."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    units = sorted(glob.glob(os.path.join(root, "tests", "unit", "test_*.py")))
    files = [path for path in units if "mark.gpu" in open(path).read()]
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--tb=short"]
    command += ["-p", "no:cacheprovider", *files]
    try:
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return {"finished": False, "timeout_s": timeout_s, "output_tail": str(e.stdout)[-3000:]}
    lines = done.stdout.strip().splitlines()
    return {
        "finished": True,
        "modules": [os.path.relpath(path, root) for path in files],
        "returncode": done.returncode,
        "summary": lines[-1] if lines else "",
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
        # what failed and where (short tracebacks), for the next change to start from
        "output_tail": done.stdout[-8000:] if done.returncode else "",
    }


def parse_args(argv: List[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen2-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=16, help="tasks per step")
    parser.add_argument("--repeat", type=int, default=8, help="samples per task")
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument(
        "--batches",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[64, 128, 256],
        help="engine rows per generate call to time, comma-separated (multiples of --repeat)",
    )
    parser.add_argument("--max-tokens-per-pass", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per figure")
    parser.add_argument(
        "--param-dtype", default=None, help="the trainer's compute dtype; unset: the machine's"
    )
    parser.add_argument(
        "--rollout-correction", action="store_true", help="the stage corrects as CORRECTION says"
    )
    parser.add_argument("--unit-timeout", type=int, default=180, help="seconds; 0: no unit tier")
    parser.add_argument("--out", default=None, help="JSON path; default docs/results/...")
    parser.add_argument("--work-dir", default=None, help="model, data, run; default: a temp dir")
    return parser.parse_args(argv)


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    root = args.work_dir or tempfile.mkdtemp(prefix="gpu_check_")
    start = time.monotonic()
    model = build_tiny_model(os.path.join(root, "model"), device=str(device), **SHAPES[args.preset])
    with torch.device("meta"):  # counted without allocating (tied weights once)
        params = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(model)
        ).num_parameters()
    report: Dict[str, Any] = {
        "card": card,
        "torch": torch.__version__,
        "model": {"shape": args.preset, **SHAPES[args.preset], "parameters": params},
        "peak_bf16_flops": peak_flops(card),
        "settings": vars(args),
    }
    slug = card.replace("NVIDIA ", "").replace(" ", "_").lower()
    out = args.out or os.path.join("docs", "results", f"gpu_check_{slug}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # Each part is reported on its own, and written as soon as it is done: a failing or
    # cut-off part leaves the others' figures (a GPU is lent for minutes).
    try:
        report.update(engine_figures(model, device, args))
        for mode in ("shared_prefix", "plain"):
            rate = report["trainer_pass"][mode]["tokens_per_s"]
            peak = report["peak_bf16_flops"]
            report["trainer_pass"][mode]["mfu"] = rate * 6 * params / peak if peak else None
    except Exception:
        report["engine_error"] = traceback.format_exc()
    write_report(report, out, start)
    engines = ["transformers"]
    if device.type == "cuda":
        ENGINES.register_module("transformers_graphs", GraphsEngine, force=True)
        engines.append("transformers_graphs")
    for engine in engines:
        reset_peak(device)  # each stage's peak from zero
        try:
            stage = run_stage(root, model, engine, args)
            summary = summarize_stage(stage, params, report["peak_bf16_flops"])
            summary["process_peak_memory_gb"] = peak_gb(device)
            report.setdefault("stages", {})[engine] = summary
        except BaseException:
            report.setdefault("stage_errors", {})[engine] = traceback.format_exc()
        write_report(report, out, start)
    if device.type == "cuda" and args.unit_timeout:
        report["unit_tier"] = unit_tier(args.unit_timeout)
    report["work_dir"] = root
    write_report(report, out, start)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
