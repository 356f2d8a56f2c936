"""Rollout throughput: the ``transformers`` engine against plain ``model.generate``.

Both systems sample from the same model object, on the same chat-formatted arithmetic
prompts (the same token ids), ``--samples`` responses per prompt at temperature 1.0 with
no top-k/top-p, and both are forced to produce exactly ``--tokens`` new tokens
(``min_tokens = max_tokens`` for the engine, ``min_new_tokens = max_new_tokens`` for
``generate``), so they do the same amount of useful work. ``generate`` runs the whole
batch at once with left padding and ``num_return_sequences``; the engine prefills each
prompt once and shares that cache among its samples (docs/performance.md). Both use the same
torch thread count. The two systems alternate within each repeat, so machine noise
falls on both. It measures; it asserts nothing.

Usage::

    python bench/rollout.py --preset tiny --preset 25m --out rollout.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import torch
import transformers

from trinity.demo.tiny import TINY_PRESETS, build_tiny_preset
from trinity.engine.hf_engine import SamplingParams, TransformersEngine


def make_messages(n: int, seed: int = 0) -> List[List[Dict[str, str]]]:
    """``n`` single-turn chats asking for a sum of two 1-3 digit numbers (varied lengths,
    so the batch really is padded)."""
    rng = random.Random(seed)
    chats = []
    for _ in range(n):
        a, b = rng.randint(0, 10 ** rng.randint(1, 3)), rng.randint(0, 999)
        chats.append([{"role": "user", "content": f"What is {a}+{b}? Answer with a number."}])
    return chats


def run_engine(
    engine: TransformersEngine, prompts: List[List[int]], samples: int, tokens: int
) -> int:
    """One engine call; returns the number of tokens it generated."""
    params = SamplingParams(
        n=samples, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=tokens, min_tokens=tokens
    )
    outputs = engine.generate(prompts, [params] * len(prompts))
    return sum(len(o.token_ids) for group in outputs for o in group)


@torch.inference_mode()
def run_generate(
    model: Any, tokenizer: Any, prompts: List[List[int]], samples: int, tokens: int
) -> int:
    """One batched ``model.generate`` call; returns the number of tokens it generated."""
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt").to(
        model.device
    )
    out = model.generate(
        **batch,
        do_sample=True,
        temperature=1.0,
        top_k=0,  # no top-k: generate would otherwise apply its default of 50
        top_p=1.0,
        num_return_sequences=samples,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        pad_token_id=tokenizer.pad_token_id,
    )
    return out.shape[0] * (out.shape[1] - batch["input_ids"].shape[1])


def _timed(fn: Callable[[], int]) -> Dict[str, float]:
    start = time.perf_counter()
    generated = fn()
    if torch.cuda.is_available():  # the last kernels may still be running
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start, "tokens": generated}


def _stats(runs: List[Dict[str, float]]) -> Dict[str, Any]:
    rates = [r["tokens"] / r["seconds"] for r in runs]
    return {
        "tokens": [int(r["tokens"]) for r in runs],
        "seconds": [round(r["seconds"], 4) for r in runs],
        "tokens_per_s_best": max(rates),
        "tokens_per_s_median": statistics.median(rates),
    }


def bench_preset(preset: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Build (or reuse) the preset model, warm both systems up, then time ``repeats`` rounds."""
    path = build_tiny_preset(os.path.join(args.cache_dir, preset), preset)
    engines = {
        ("engine" if decoder == "auto" else f"engine_{decoder}"): TransformersEngine(
            path,
            max_model_len=TINY_PRESETS[preset]["max_position_embeddings"],
            max_prompt_tokens=None,
            max_response_tokens=args.tokens,
            min_response_tokens=args.tokens,
            seed=args.seed,
            num_threads=args.threads,
            device=args.device,
            dtype=args.dtype,
            decoder=decoder,
        )
        for decoder in args.decoders
    }
    first = next(iter(engines.values()))
    model, tokenizer = first.model, first.tokenizer  # the weights all systems load alike
    prompts = [first.apply_chat_template(m) for m in make_messages(args.prompts, args.seed)]
    systems = {
        **{
            name: lambda p, s, t, e=engine: run_engine(e, p, s, t)
            for name, engine in engines.items()
        },
        "generate": lambda p, s, t: run_generate(model, tokenizer, p, s, t),
    }
    for run in systems.values():  # warm-up: first-call costs are not throughput
        run(prompts[:2], 2, 4)
    torch.manual_seed(args.seed)
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in systems}
    for repeat in range(args.repeats):
        order = list(systems) if repeat % 2 == 0 else list(systems)[::-1]
        for name in order:
            runs[name].append(_timed(lambda n=name: systems[n](prompts, args.samples, args.tokens)))
    result = {name: _stats(r) for name, r in runs.items()}
    return {
        "preset": preset,
        "parameters": sum(p.numel() for p in model.parameters()),
        "prompt_tokens": [len(p) for p in prompts],
        **result,
        "ratio_best": result["engine"]["tokens_per_s_best"]
        / result["generate"]["tokens_per_s_best"],
        "ratio_median": result["engine"]["tokens_per_s_median"]
        / result["generate"]["tokens_per_s_median"],
        "ratios_median": {  # each engine's decoder against generate
            name: result[name]["tokens_per_s_median"] / result["generate"]["tokens_per_s_median"]
            for name in engines
        },
    }


def summary(report: Dict[str, Any]) -> str:
    """The one-line summary: per preset, median tokens/s of each system and the ratio."""
    c = report["config"]
    parts = [
        f"{r['preset']} ({r['parameters'] / 1e6:.1f}M): "
        + ", ".join(
            f"{name} {r[name]['tokens_per_s_median']:.0f} tok/s = {ratio:.2f}x"
            for name, ratio in r["ratios_median"].items()
        )
        + f" of generate {r['generate']['tokens_per_s_median']:.0f} tok/s"
        + f" (engine best {r['ratio_best']:.2f}x)"
        for r in report["results"]
    ]
    return (
        f"rollout {c['prompts']}x{c['samples']}x{c['tokens']}, {c['threads']} thread(s), "
        f"median of {c['repeats']}: " + "; ".join(parts)
    )


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", action="append", choices=sorted(TINY_PRESETS))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both systems)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--decoders",
        type=lambda text: text.split(","),
        default=["auto"],
        help="the engine's decoders to time, comma-separated (auto, static; graphs on cuda)",
    )
    parser.add_argument("--out", default="rollout.json")
    parser.add_argument(
        "--cache-dir", default=os.path.join(tempfile.gettempdir(), "trinity-bench-models")
    )
    args = parser.parse_args(argv)
    args.preset = args.preset or ["tiny", "25m"]
    return args


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, write the JSON report to ``--out``, print the summary; return it."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {
        "benchmark": "rollout",
        "config": {
            **{
                k: getattr(args, k)
                for k in (
                    "prompts",
                    "samples",
                    "tokens",
                    "repeats",
                    "seed",
                    "device",
                    "dtype",
                    "decoders",
                )
            },
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        },
        "results": [bench_preset(preset, args) for preset in args.preset],
    }
    report["summary"] = summary(report)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
