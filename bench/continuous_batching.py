"""Continuous batching: a GRPO step's requests through the transformers engine, before and
after (``trinity/engine/streaming.py``).

A step is what the SmolLM2 example's explorer sends (examples/smollm2/grpo.yaml): ``--tasks``
word problems (chat prompts of math_workflow, their rewards scored by math_verify), each
asking ``--samples`` samples at temperature 1, dealt to 2 workflow runners that run every
task in a thread of its own, so the whole step is in flight at once. Each side runs in a
child process of its own code: "before" is main's commit ``--before`` exported with
``git archive`` (the engine that sampled a batch of requests in one ``generate`` call),
"after" this checkout. Per step: the wall time until the last task returned, rows
(samples) and tokens per second, and when each task returned (the median). Sides alternate
within each repeat, so machine noise falls on both. Each child sets glibc's malloc as its
code's ``trinity run`` does (``trinity/utils/allocator.py``, none before ab5a14c);
``TRINITY_MALLOC=default`` leaves glibc's defaults on both sides. It measures; it asserts
nothing.

``--engine`` measures the engine alone on the same work for both sides: the rows' reply
lengths are first sampled once by this checkout's engine (temperature 1, the step's chat
prompts, up to ``--max-tokens``), then each side's ``TransformersEngine.generate`` decodes
every row as a request of its own (its prompt's prefill shared) to exactly its sampled length
(``min_tokens = max_tokens``). Both sides then sample as many tokens at the same batch
sizes, so tokens per second compares the engines' speed under the real reply-length spread
rather than what each side's unseeded samples happened to be.

Usage::

    python bench/continuous_batching.py --out docs/results/continuous_batching.json
    python bench/continuous_batching.py --engine --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNERS = 2  # examples/smollm2/grpo.yaml: runner_per_model


def run_steps(spec: Dict[str, Any]) -> Dict[str, Any]:
    """In the child: ``spec["steps"]`` steps (after one warm-up step) through an engine
    built from the ``trinity`` on ``sys.path``; the figures of each."""
    try:  # glibc's malloc as that code's `trinity run` sets it (TRINITY_MALLOC=default: off)
        from trinity.utils.allocator import tune
    except ImportError:  # code from before the allocator settings (ab5a14c)
        pass
    else:
        tune()
    from trinity.engine.local import LocalEngine
    from trinity.explorer.runner import WorkflowRunner

    with open(spec["data"]) as f:
        rows = [json.loads(line) for line in f]
    # on a loop of its own thread, as the explorer's engines run in a one-process stage
    engine = LocalEngine(
        "transformers",
        model_path=spec["model"],
        dtype=spec["dtype"],
        max_model_len=96 + spec["max_tokens"],
        max_prompt_tokens=96,
        max_response_tokens=spec["max_tokens"],
        num_threads=spec["threads"],
        **({"max_num_seqs": spec["slots"]} if spec["slots"] else {}),
    )
    params = {"max_tokens": spec["max_tokens"], "min_tokens": 0}
    runners = [WorkflowRunner(engine, default_params=params) for _ in range(RUNNERS)]
    tasks = spec["tasks"]
    # warm-up (first forwards, the reward's imports): one task of 4 tokens, on another row
    short = WorkflowRunner(engine, default_params={"max_tokens": 4, "min_tokens": 0})
    run_step([short], rows[spec["steps"] * tasks :][:1], spec)
    return {
        "steps": [run_step(runners, rows[i * tasks :][:tasks], spec) for i in range(spec["steps"])]
    }


def chat_prompts(engine: Any, rows: List[Dict[str, Any]]) -> List[List[int]]:
    """The rows' questions as the chat prompts of a user turn (the model's template)."""
    return [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": row["question"]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for row in rows
    ]


def run_engine(spec: Dict[str, Any]) -> Dict[str, Any]:
    """In the child, ``--engine``: with ``spec["lengths"]`` None, sample every step's reply
    lengths; else decode each step's rows to those lengths and time it."""
    # the same malloc settings on both sides: this checkout's (the engine is what differs)
    where = os.path.join(ROOT, "trinity", "utils", "allocator.py")
    allocator = importlib.util.spec_from_file_location("bench_allocator", where)
    module = importlib.util.module_from_spec(allocator)
    allocator.loader.exec_module(module)
    module.tune()
    from trinity.common.models.sampling import SamplingParams
    from trinity.engine.hf_engine import TransformersEngine

    with open(spec["data"]) as f:
        rows = [json.loads(line) for line in f]
    engine = TransformersEngine(
        spec["model"],
        dtype=spec["dtype"],
        num_threads=spec["threads"],
        max_model_len=96 + spec["max_tokens"],
        max_prompt_tokens=96,
        max_response_tokens=spec["max_tokens"],
    )
    tasks, samples = spec["tasks"], spec["samples"]
    prompts = [chat_prompts(engine, rows[i * tasks :][:tasks]) for i in range(spec["steps"])]
    if spec["lengths"] is None:
        params = SamplingParams(n=samples, temperature=1.0, max_tokens=spec["max_tokens"])
        outs = [engine.generate(p, [params] * len(p)) for p in prompts]
        return {"lengths": [[len(o.token_ids) for r in out for o in r] for out in outs]}
    warm = SamplingParams(n=samples, temperature=1.0, max_tokens=4, min_tokens=4)
    engine.generate(prompts[0], [warm] * len(prompts[0]))
    figures = []
    for step, lengths in zip(prompts, spec["lengths"], strict=True):
        each = [p for p in step for _ in range(samples)]  # row by row, as the lengths are
        params = [SamplingParams(n=1, temperature=1.0, max_tokens=n, min_tokens=n) for n in lengths]
        start = time.perf_counter()
        outs = engine.generate(each, params)
        wall = time.perf_counter() - start
        tokens = sum(len(o[0].token_ids) for o in outs)
        assert tokens == sum(lengths), (tokens, sum(lengths))
        figures.append(
            {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1)}
        )
    return {"steps": figures}


def run_step(runners: List[Any], rows: List[Dict[str, Any]], spec: Dict[str, Any]) -> Dict:
    """One step: a math_workflow task per row, all in flight at once, dealt to the runners."""
    from trinity.common.config import FormatConfig, GenerationConfig
    from trinity.common.workflows import Task

    tasks = [
        Task(
            workflow="math_workflow",
            reward_fn="math_verify_reward",
            raw_task=row,
            format_args=FormatConfig(prompt_key="question", response_key="answer"),
            rollout_args=GenerationConfig(n=spec["samples"], temperature=1.0),
            task_id=str(i),
        )
        for i, row in enumerate(rows)
    ]
    returned: List[float] = [0.0] * len(tasks)
    results: List[Any] = [None] * len(tasks)
    start = time.perf_counter()

    def run(i: int) -> None:
        results[i] = runners[i % len(runners)].run_task(tasks[i])
        returned[i] = time.perf_counter() - start

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(errors[0])
    experiences = [e for r in results for e in r.experiences]
    tokens = sum(len(e.tokens) - e.prompt_length for e in experiences)
    return {
        "wall_s": round(wall, 3),
        "rows_per_s": round(len(experiences) / wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens": tokens,
        "median_task_return_s": round(statistics.median(returned), 3),
        "first_task_return_s": round(min(returned), 3),
    }


def export_before(commit: str, where: str) -> str:
    """``commit``'s ``trinity`` package, exported to ``where`` (a plain copy, no checkout)."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "trinity"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    return where


def run_side(code_root: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    """One child process running ``spec`` with the ``trinity`` of ``code_root``."""
    env = dict(os.environ, PYTHONPATH=code_root)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=code_root,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(steps: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians over every measured step of every repeat."""
    keys = ("wall_s", "rows_per_s", "tokens_per_s", "median_task_return_s")
    return {k: round(statistics.median(s[k] for s in steps), 3) for k in keys if k in steps[0]}


def compare(sides: Dict[str, str], args: Any, tasks: int, max_tokens: int) -> Dict[str, Any]:
    """Both sides on steps of ``tasks`` tasks, ``args.repeats`` times, in alternating order."""
    spec = dict(
        model=args.model,
        data=args.data,
        tasks=tasks,
        samples=args.samples,
        max_tokens=max_tokens,
        slots=args.slots,
        dtype=args.dtype,
        threads=args.threads,
        steps=args.steps,
        engine=args.engine,
        lengths=None,
    )
    run = {"tasks": tasks, "max_tokens": max_tokens, "rows": tasks * args.samples}
    if args.engine:  # the reply lengths both sides decode to, sampled once here
        spec["lengths"] = run["lengths"] = run_side(sides["after"], spec)["lengths"]
    steps: Dict[str, List[Dict[str, Any]]] = {"before": [], "after": []}
    for repeat in range(args.repeats):
        for side in ["before", "after"] if repeat % 2 == 0 else ["after", "before"]:
            steps[side] += run_side(sides[side], spec)["steps"]
    run.update({side: {"median": summary(s), "steps": s} for side, s in steps.items()})
    print(json.dumps({k: run[k] for k in ("tasks", "max_tokens")}), flush=True)
    for side in ("before", "after"):
        print(f"  {side}: {run[side]['median']}", flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="./smollm2/model", help="prepare-quickstart's")
    parser.add_argument("--data", default="./smollm2/data/rl/train.jsonl")
    parser.add_argument("--before", default="31c5d4e", help="main's commit before the change")
    parser.add_argument("--tasks", type=int, nargs="+", default=[8], help="tasks per step")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--slots", type=int, default=0, help="max_num_seqs (0: the default)")
    parser.add_argument("--dtype", default="float32")
    # One: on a shared 2-core machine two OpenMP threads made a step 10x slower (busy cores)
    parser.add_argument("--threads", type=int, default=1, help="the engine's torch threads")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--engine", action="store_true", help="the engine alone (docstring)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps((run_engine if spec.get("engine") else run_steps)(spec)))
        return
    load_start = os.getloadavg()[0]
    # each side's child runs in its own code folder: paths given here are read from here
    args.model, args.data = os.path.abspath(args.model), os.path.abspath(args.data)
    sides = {"before": export_before(args.before, tempfile.mkdtemp()), "after": ROOT}
    runs = [
        compare(sides, args, tasks, max_tokens)
        for tasks in args.tasks
        for max_tokens in args.max_tokens
    ]
    result = {
        "what": (
            "the engine alone, each row decoded to its sampled reply length"
            if args.engine
            else "a GRPO step's requests (math_workflow, 2 runners, every task in a thread) "
            "through the transformers engine"
        )
        + ": main before continuous batching vs after",
        "before_commit": args.before,
        "model": args.model,
        "samples_per_task": args.samples,
        "temperature": 1.0,
        "dtype": args.dtype,
        "threads": args.threads,
        "max_num_seqs": args.slots or "default (256)",
        "steps_per_run": args.steps,
        "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
