"""The rollout engines side by side on SmolLM2-135M-Instruct: ``transformers`` against ``vllm``.

Part 1, the engines alone, each in a process of its own (``--worker``), one after the other,
alternating, ``--rounds`` times for each dtype: the same chat-formatted word problems (the same
token ids), ``--samples`` samples each at temperature 0.8, every sample exactly ``--tokens`` new
tokens (min_tokens = max_tokens, so both do the same work). Each worker reports its start
(construction to ready), generated tokens/s (median of its repeats), the resident memory of
its process tree (vLLM runs its model in child processes) and the median time of a weight sync
(``load_weights`` of the full state dict, checks included). With ``--shared`` every measure is
taken again while a second process runs matrix products on every core, as a trainer does
beside an engine in the asynchronous sync styles, and the transformers engine once more on one
thread (the cores actually free).

Part 2 (``--grpo-steps N``): ``examples/smollm2/grpo.yaml`` and ``grpo_vllm.yaml`` end to end,
one after the other: samples/s over the run and greedy held-out accuracy at each evaluation.

It measures; it asserts nothing. Usage::

    python bench/engines.py --data ./smollm2 --shared --out docs/results/engines.json
    python bench/engines.py --data ./smollm2 --grpo-steps 50 --out engines_grpo.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINES = ("transformers", "vllm")


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and all its descendants."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def prompts(data: str, render: Any, n: int) -> List[List[int]]:
    """The first ``n`` training word problems as chat prompts (token ids): the same for every
    engine."""
    with open(os.path.join(data, "data", "rl", "train.jsonl")) as f:
        questions = [json.loads(line)["question"] for line in itertools.islice(f, n)]
    return [render([{"role": "user", "content": q}]) for q in questions]


def worker(args: argparse.Namespace) -> Dict[str, Any]:
    """One engine in this process: start, tokens/s, memory, sync time."""
    import asyncio

    import torch

    from trinity.common.models.sampling import SamplingParams
    from trinity.engine import ENGINES as REGISTRY

    start = time.monotonic()
    model = REGISTRY.get(args.worker)(
        model_path=os.path.join(args.data, "model"),
        max_model_len=512,
        max_prompt_tokens=256,
        max_response_tokens=args.tokens,
        dtype=args.dtype,
        num_threads=args.threads,
    )
    started = time.monotonic() - start
    ids = prompts(args.data, model.engine.apply_chat_template, args.prompts)
    params = SamplingParams(
        n=args.samples, temperature=0.8, max_tokens=args.tokens, min_tokens=args.tokens
    )

    async def one_step() -> int:
        groups = await asyncio.gather(*[model.generate_ids(p, params) for p in ids])
        return sum(len(e.tokens) - e.prompt_length for group in groups for e in group)

    asyncio.run(one_step())  # warm-up
    rates = []
    for _ in range(args.repeats):
        begin = time.monotonic()
        tokens = asyncio.run(one_step())
        rates.append(tokens / (time.monotonic() - begin))
    from transformers import AutoModelForCausalLM

    folder = os.path.join(args.data, "model")
    state = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    syncs = []
    for version in range(1, 4):
        begin = time.monotonic()
        asyncio.run(model.load_weights(state, version))
        syncs.append(time.monotonic() - begin)
    result = {
        "engine": args.worker,
        "dtype": args.dtype,
        "threads": args.threads or "default",
        "start_s": round(started, 2),
        "tokens_per_s": round(statistics.median(rates), 1),
        "tokens_per_s_each": [round(r, 1) for r in rates],
        "rss_gib": round(tree_rss(os.getpid()) / 2**30, 2),
        "sync_s": round(statistics.median(syncs), 3),
    }
    model.close()
    return result


def run_worker(
    args: argparse.Namespace, engine: str, dtype: str, threads: int = 0
) -> Dict[str, Any]:
    """One worker's result; one that has not finished in ``--worker-timeout`` seconds is
    stopped and reported as such (threads spinning against a busy process can take hours)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--worker", engine, "--dtype", dtype]
        command += ["--threads", str(threads)] if threads else []
        command += ["--data", args.data, "--worker-out", out.name]
        command += ["--prompts", str(args.prompts), "--samples", str(args.samples)]
        command += ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
        worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            code = worker.wait(timeout=args.worker_timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            # its warm-up and timed batches were not done in that time: a rate bound
            batches = (1 + args.repeats) * args.prompts * args.samples * args.tokens
            return {
                "engine": engine,
                "dtype": dtype,
                "threads": threads or "default",
                "timed_out_s": args.worker_timeout,
                "tokens_per_s_below": round(batches / args.worker_timeout, 1),
            }
        if code != 0:
            raise RuntimeError(f"the {engine} {dtype} worker exited with status {code}")
        with open(out.name) as f:
            return json.load(f)


def busy_process() -> subprocess.Popen:
    """A second process doing float32 matrix products on every core (a trainer's load)."""
    code = "import torch\nx = torch.randn(1024, 1024)\nwhile True:\n    x = torch.tanh(x @ x)\n"
    return subprocess.Popen([sys.executable, "-c", code])


def engine_part(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Every worker's result; with ``--resume FILE`` (JSON lines this part printed) the ones
    listed there are taken from it, in order, and only the rest are run."""
    done: List[Dict[str, Any]] = []
    if args.resume:
        with open(args.resume) as f:
            done = [json.loads(line) for line in f if line.startswith("{")]
    results = []
    for shared in [False, True] if args.shared else [False]:
        busy = busy_process() if shared else None
        try:
            for dtype in args.dtypes:
                for _ in range(args.rounds):  # alternating: the machine's drift falls on both
                    # beside a busy process, also the transformers engine on one thread: the
                    # cores actually free
                    runs = [(e, 0) for e in ENGINES] + ([("transformers", 1)] if shared else [])
                    for engine, threads in runs:
                        if done:
                            results.append(done.pop(0))
                            continue
                        result = run_worker(args, engine, dtype, threads)
                        result["shared_cores"] = shared
                        print(json.dumps(result), flush=True)
                        results.append(result)
        finally:
            if busy is not None:
                busy.kill()
    return results


def grpo_part(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The SmolLM2 example with each engine: samples/s and held-out accuracy."""
    results = []
    for config in ("grpo.yaml", "grpo_vllm.yaml"):
        root = tempfile.mkdtemp(prefix="bench-engines-")
        env = dict(os.environ, TRINITY_SMOLLM2_DIR=args.data, TRINITY_CHECKPOINT_ROOT_DIR=root)
        command = ["trinity", "run", "--config", os.path.join(ROOT, "examples", "smollm2", config)]
        command += [f"buffer.total_steps={args.grpo_steps}", "trainer.save_interval=0"]
        command += [f"explorer.eval_interval={args.eval_interval}"]
        begin = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - begin
        (job,) = [
            os.path.join(d, n) for d in [os.path.join(root, "smollm2")] for n in os.listdir(d)
        ]
        with open(os.path.join(job, "monitor", "explorer.jsonl")) as f:
            records = [json.loads(line) for line in f]
        accuracy = {
            r["step"]: r[key]
            for r in records
            for key in r
            if key.startswith("eval/") and key.endswith("accuracy/mean")
        }
        samples = args.grpo_steps * 8 * 8  # batch_size x repeat_times of the example
        result = {
            "config": f"examples/smollm2/{config}",
            "steps": args.grpo_steps,
            "wall_s": round(wall, 1),
            "samples_per_s": round(samples / wall, 2),
            "held_out_accuracy": accuracy,
        }
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", required=True, help="the folder of prepare-quickstart --task smollm2"
    )
    parser.add_argument("--out", help="the JSON result file")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=2, help="workers per engine and dtype")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="timed batches per worker")
    parser.add_argument("--shared", action="store_true", help="again beside a busy process")
    parser.add_argument("--worker-timeout", type=float, default=600, help="seconds per worker")
    parser.add_argument("--resume", help="JSON lines of workers already run (printed by one)")
    parser.add_argument("--grpo-steps", type=int, default=0, help="also the GRPO example")
    parser.add_argument("--eval-interval", type=int, default=25)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with open(args.worker_out, "w") as f:
            json.dump(worker(args), f)
        return
    report: Dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("worker")},
        "engines": engine_part(args),
    }
    if args.grpo_steps:
        report["grpo"] = grpo_part(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
