"""The same GRPO run through ``model.chat`` and through the OpenAI client with history.

Both paths explore the quickstart's arithmetic tasks with the same tiny model, batch geometry
and sampling, in this process on one Ray: ``direct`` with the built-in ``math_workflow``
(``model.chat``), ``openai`` with a workflow that makes the same request over HTTP
(``explorer.rollout_model.enable_openai_api`` + ``enable_history``, see
``bench/openai_plugins/openai_math.py``). The paths alternate for ``--rounds`` rounds, so a
drift in the machine's load hits both. Rollout samples/s is counted over the explore steps
(``time/explore_step``, the first of each run left out as warm-up)::

    python bench/openai_overhead.py --steps 12 --rounds 3 --out docs/results/openai_overhead.json

Writes JSON and prints a one-line summary with the ratio (HTTP / direct: the median of the
rounds' ratios). It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from typing import Dict, List

from trinity.monitor import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
PLUGINS = os.path.join(ROOT, "bench", "openai_plugins")


def grpo_config(workdir: str) -> str:
    """The quickstart config without its stages (the GRPO settings alone)."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(workdir, "grpo.yaml")
    with open(path, "w") as f:
        f.write(text[: text.index("stages:")])
    return path


PATHS = {
    "direct": [],
    "openai": [
        "buffer.explorer_input.default_workflow_type=openai_math_bench",
        "explorer.rollout_model.enable_openai_api=true",
        "explorer.rollout_model.enable_history=true",
    ],
}


def one_run(config: str, name: str, extra: List[str], args: argparse.Namespace) -> Dict:
    from trinity.runtime.launcher import run

    overrides = [
        f"name={name}",
        f"checkpoint_root_dir={os.path.join(args.workdir, 'checkpoints')}",
        f"model.model_path={args.model}",
        f"buffer.explorer_input.taskset.path={args.data}",
        "buffer.explorer_input.eval_tasksets=[]",
        f"buffer.total_steps={args.steps}",
        f"buffer.batch_size={args.batch_size}",
        "continue_from_checkpoint=false",
        # Both paths sample the same lengths: without max_tokens the API would allow what is
        # left of max_model_len (the guide's rule), model.chat max_response_tokens.
        "buffer.explorer_input.taskset.rollout_args.max_tokens=8",
        "trainer.save_hf_checkpoint=never",
        *extra,
    ]
    (result,) = run(config, overrides, [PLUGINS])
    records = read_metrics(os.path.join(result.job_dir, "monitor", "explorer.jsonl"))
    steps = [r for r in records if "time/explore_step" in r][1:]  # the first warms up
    samples = args.batch_size * 8  # repeat_times of the quickstart
    per_step = [samples / r["time/explore_step"] for r in steps]
    return {
        "path": name.split("_")[0],
        "samples_per_s": statistics.median(per_step),
        "explore_step_s": [r["time/explore_step"] for r in steps],
        "reward_mean": statistics.mean(r["rollout/reward/mean"] for r in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--model", default=None, help="an HF folder (default: a fresh tiny)")
    parser.add_argument("--data", default=None, help="arithmetic data (default: generated)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each path, alternated")
    parser.add_argument("--out", default="openai_overhead.json")
    args = parser.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="openai-overhead-")
    if args.model is None:
        from trinity.demo.tiny import build_tiny_preset

        args.model = build_tiny_preset(os.path.join(args.workdir, "model"), "tiny")
    if args.data is None:
        from trinity.demo.synthetic import make_arithmetic

        args.data = os.path.join(args.workdir, "rl")
        make_arithmetic(args.data, n_train=args.steps * args.batch_size, n_test=8, digits=2, seed=0)
    config = grpo_config(args.workdir)
    import ray

    from trinity.runtime.launcher import init_ray

    init_ray("bench_openai_overhead")  # one Ray for every run: no start-up cost in a run
    try:
        runs = [
            one_run(config, f"{path}_{r}", extra, args)
            for r in range(args.rounds)
            for path, extra in PATHS.items()
        ]
    finally:
        ray.shutdown()
    ratios = [
        h["samples_per_s"] / d["samples_per_s"] for d, h in zip(runs[::2], runs[1::2], strict=True)
    ]
    by_path = {
        path: statistics.median(r["samples_per_s"] for r in runs if r["path"] == path)
        for path in PATHS
    }
    ratio = statistics.median(ratios)
    result = {
        "setup": {k: v for k, v in vars(args).items() if k != "workdir"},
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "samples_per_s": by_path,
        "round_ratios": ratios,
        "ratio": ratio,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        f"openai_overhead {args.steps} steps x {args.batch_size * 8} samples, {args.rounds} "
        f"rounds: model.chat {by_path['direct']:.1f} samples/s, OpenAI client + history "
        f"{by_path['openai']:.1f} samples/s = {ratio:.2f}x (median of the rounds' ratios)"
    )


if __name__ == "__main__":
    main()
