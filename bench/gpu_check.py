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
- ``engine``: the rollout engine's tokens/s against plain ``model.generate`` on the same card,
  same prompts, samples and lengths (best of a few timed calls after a warm-up), and its
  peak memory while generating;
- ``logprobs``: engine (bf16 weights) against trainer (fp32 weights under bf16 autocast) on
  the engine's own samples, and the stage's ``actor/ppo_kl`` at step 1;
- ``sync``: seconds to hand weights over (the trainer's publish, the engine's load, and the
  engine's release and reload of its weights while the trainer steps);
- ``stage``: its steps, wall time and whether it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trinity.common.experience import Experience, ExperienceBatch  # noqa: E402
from trinity.demo.synthetic import make_arithmetic  # noqa: E402
from trinity.demo.tiny import TINY_PRESETS, build_tiny_model  # noqa: E402
from trinity.engine.hf_engine import SamplingParams, TransformersEngine  # noqa: E402
from trinity.trainer.policy_step import micro_batches, response_logprobs  # noqa: E402
from trinity.utils.device import compute_in  # noqa: E402

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


def stage_config(root: str, model: str, data: Dict[str, str], args: Any) -> str:
    """A colocated GRPO stage over the generated data; returns the YAML's path."""
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
        "name": "grpo",
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
        "explorer": {"runner_per_model": 4, "concurrent_mode": "multi-threading"},
        "trainer": {
            "save_interval": 0,
            "save_hf_checkpoint": "never",
            "trainer_config": {"actor_rollout_ref": arr},
        },
    }
    path = os.path.join(root, "grpo.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


def read_metrics(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_stage(root: str, model: str, args: Any) -> Dict[str, Any]:
    """``trinity run`` of the colocated stage (its own process is this one); its figures."""
    from trinity.runtime.launcher import run

    data = make_arithmetic(
        os.path.join(root, "data"), n_train=args.tasks * args.steps, n_test=8, digits=2
    )
    start = time.monotonic()
    # DEBUG: the engine logs each batch it generates, so its share of a step can be read
    results = run(stage_config(root, model, data, args), ["log.level=DEBUG"], [])
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


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else 0.0


def engine_figures(model: str, device: torch.device, args: Any) -> Dict[str, Any]:
    """Engine vs ``generate`` tokens/s, peak memory, logprob agreement and weight-sync times."""
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    length = args.response_tokens
    reset_peak(device)
    engine = TransformersEngine(
        model,
        max_model_len=64 + length,
        max_prompt_tokens=64,
        max_response_tokens=length,
        min_response_tokens=length,  # every row the same length, as generate's below
        dtype=dtype,
        device=str(device),
    )
    weights_gb = peak_gb(device)
    questions = [f"{10 + i}+{40 + i}=" for i in range(args.tasks)]
    prompts = [engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    params = [SamplingParams(n=args.repeat, temperature=1.0, max_tokens=length)] * len(prompts)
    reset_peak(device)
    engine_s = best_of(lambda: engine.generate(prompts, params), args.repeats)
    engine_peak = peak_gb(device)
    outputs = engine.generate(prompts, params)
    rows = len(prompts) * args.repeat

    generate_s = generate_seconds(model, engine.model.dtype, device, prompts, engine.pad_id, args)
    pad = engine.pad_id

    # The trainer's view of the same samples: fp32 master weights under bf16 autocast.
    trainer_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    compute_in(trainer_model, torch.bfloat16 if device.type == "cuda" else torch.float32)
    agreement = logprob_agreement(trainer_model, prompts, outputs, pad)

    passes = trainer_pass_figures(trainer_model, prompts, outputs, pad, args)
    state = trainer_model.state_dict()
    publish_s = best_of(lambda: {k: v.detach().clone() for k, v in state.items()}, 3)
    load_s = best_of(lambda: engine.load_state_dict(state), 3)
    release_s, restore_s = [], []
    for _ in range(3):
        sync()
        start = time.perf_counter()
        freed = engine.release()
        sync()
        release_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.load_state_dict(state)
        sync()
        restore_s.append(time.perf_counter() - start)
    return {
        "engine": {
            "rows": rows,
            "response_tokens": length,
            "tokens_per_s": rows * length / engine_s,
            "generate_tokens_per_s": rows * length / generate_s,
            "speedup_vs_generate": generate_s / engine_s,
            "weights_gb": weights_gb,
            "peak_memory_gb": engine_peak,
        },
        "logprobs": agreement,
        "trainer_pass": passes,
        "sync": {
            "trainer_publish_s": publish_s,
            "engine_load_s": load_s,
            "engine_release_s": min(release_s),
            "engine_reload_after_release_s": min(restore_s),
            "released_gb": freed / 1e9,
        },
    }


def generate_seconds(
    model: str,
    dtype: torch.dtype,
    device: torch.device,
    prompts: List[List[int]],
    pad: int,
    args: Any,
) -> float:
    """Best time of plain ``model.generate`` sampling the engine's rows at the same lengths."""
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    length = args.response_tokens
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    mask = (torch.arange(width, device=device)[None] >= width - lengths[:, None]).long()

    def plain_generate() -> None:
        with torch.inference_mode():
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                num_return_sequences=args.repeat,
                max_new_tokens=length,
                min_new_tokens=length,
                pad_token_id=pad,
            )

    return best_of(plain_generate, args.repeats)


def experiences_of(prompts: List[List[int]], outputs: List[Any]) -> List[Experience]:
    return [
        Experience(tokens=p + o.token_ids, prompt_length=len(p), logprobs=o.logprobs)
        for p, group in zip(prompts, outputs, strict=True)
        for o in group
    ]


def trainer_pass_figures(
    model: torch.nn.Module, prompts: List[List[int]], outputs: List[Any], pad: int, args: Any
) -> Dict[str, Any]:
    """Forward + backward of the policy's logprobs over the engine's samples, in micro-batches
    of ``--max-tokens-per-pass``, with and without the shared-prefix pass: the train step's
    compute alone (no optimizer, reference model or bookkeeping). A profile of the first is
    printed."""
    batch = ExperienceBatch.from_experiences(experiences_of(prompts, outputs), pad)
    parts = micro_batches(batch, 1, args.max_tokens_per_pass)
    tokens = float(batch.attention_mask.sum())
    figures: Dict[str, Any] = {"micro_batches": len(parts), "tokens": tokens}

    def step(share: bool) -> None:
        for mb in parts:
            logprob, entropy = response_logprobs(model, mb, 1.0, share_prefix=share)
            (logprob.sum() + entropy.sum()).backward()
        model.zero_grad(set_to_none=True)

    for share in (True, False):
        seconds = best_of(lambda share=share: step(share), args.repeats)
        figures["shared_prefix" if share else "plain"] = {
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
        }
    if torch.cuda.is_available():
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(True)
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    return figures


def logprob_agreement(
    model: torch.nn.Module, prompts: List[List[int]], outputs: List[Any], pad: int
) -> Dict[str, float]:
    """|engine - trainer| logprob of each sampled token (the trainer's own scoring path)."""
    experiences = experiences_of(prompts, outputs)
    diffs = []
    with torch.no_grad():
        for start in range(0, len(experiences), 16):
            batch = ExperienceBatch.from_experiences(experiences[start : start + 16], pad)
            logprob, _ = response_logprobs(model, batch, 1.0, with_entropy=False)
            mask = batch.action_mask.bool()
            diffs.append((logprob.cpu() - batch.old_logprob)[mask].abs())
    diff = torch.cat(diffs)
    return {
        "tokens": diff.numel(),
        "mean_abs_diff": diff.mean().item(),
        "p99_abs_diff": diff.quantile(0.99).item(),
        "max_abs_diff": diff.max().item(),
    }


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


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen2-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=16, help="tasks per step")
    parser.add_argument("--repeat", type=int, default=8, help="samples per task")
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--max-tokens-per-pass", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per figure")
    parser.add_argument(
        "--param-dtype", default=None, help="the trainer's compute dtype; unset: the machine's"
    )
    parser.add_argument(
        "--rollout-correction", action="store_true", help="the stage corrects as CORRECTION says"
    )
    parser.add_argument("--out", default=None, help="JSON path; default docs/results/...")
    parser.add_argument("--work-dir", default=None, help="model, data, run; default: a temp dir")
    args = parser.parse_args(argv)
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
    reset_peak(device)  # the engine figures' models are gone: the stage starts from zero
    try:
        stage = run_stage(root, model, args)
        report["stage"] = summarize_stage(stage, params, report["peak_bf16_flops"])
        report["stage"]["process_peak_memory_gb"] = peak_gb(device)
    except BaseException:
        report["stage_error"] = traceback.format_exc()
    report["work_dir"] = root
    write_report(report, out, start)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
