"""tinker-cookbook's recipes against ``trinity tinker-serve``: a recipe run unmodified but
for its ``base_url`` and model name, its per-step metrics collected into one JSON file.

The server is started here (``python -m trinity.cli.main tinker-serve`` on a free port of
127.0.0.1, its state in a temporary folder); the recipe runs with ``--python``, an
interpreter where ``tinker-cookbook`` is installed (0.6.1 wants ``tml-renderers``, which only
its Thinking Machines models use: ``pip install --no-deps tinker-cookbook`` plus its other
dependencies serves the recipes below). Recipes:

- ``rl``: ``tinker_cookbook.recipes.math_rl.train`` (``env=arithmetic`` unless the extra
  arguments say otherwise): the reward, accuracy and format per step;
- ``sl``: ``tinker_cookbook.recipes.chat_sl.train`` on a chat JSONL file
  (``dataset=<file.jsonl>``): the training NLL per step.

    python bench/cookbook_runs.py rl --python /path/cookbook-venv/bin/python \\
        --model HuggingFaceTB/SmolLM2-135M-Instruct --out docs/results/tinker_cookbook_rl.json \\
        renderer_name=qwen3_instruct loss_fn=importance_sampling groups_per_batch=8 ...

Extra ``key=value`` arguments go to the recipe (chz reads them). It measures, never
asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

RECIPES = {
    "rl": "tinker_cookbook.recipes.math_rl.train",
    "sl": "tinker_cookbook.recipes.chat_sl.train",
}
# What each recipe's metrics.jsonl says per step that is worth keeping.
KEYS = {
    "rl": [
        "env/all/reward/total",
        "env/all/correct",
        "env/all/format",
        "time/sampling",
        "time/train_step",
        "time/total",
    ],
    "sl": ["train_mean_nll", "learning_rate", "num_tokens", "time/step"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: str, port: int, state: str, log: str) -> subprocess.Popen:
    """``trinity tinker-serve`` in its own process, once it answers ``/healthz``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [
        sys.executable,
        "-m",
        "trinity.cli.main",
        "tinker-serve",
        "--base-model",
        model,
        "--port",
        str(port),
        "--state-dir",
        state,
    ]
    env = {**os.environ, "PYTHONPATH": root}
    server = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 600
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"tinker-serve exited ({server.returncode}); see {log}")
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/v1/healthz", headers={"X-API-Key": "tml-local"}
            )
            urllib.request.urlopen(request, timeout=5).read()
            return server
        except OSError:
            time.sleep(2)
    server.terminate()
    raise RuntimeError(f"tinker-serve did not answer within 600 s; see {log}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    work = tempfile.mkdtemp(prefix="tinker-cookbook-")
    port = free_port()
    server = serve(args.model, port, os.path.join(work, "state"), os.path.join(work, "server.log"))
    log_path = os.path.join(work, "recipe")
    recipe = [
        args.python,
        "-m",
        RECIPES[args.recipe],
        f"base_url=http://127.0.0.1:{port}",
        f"model_name={args.model}",
        f"log_path={log_path}",
        "behavior_if_log_dir_exists=delete",
        *args.recipe_args,
    ]
    env = {**os.environ, "TINKER_API_KEY": "tml-local"}
    start = time.time()
    try:
        done = subprocess.run(
            recipe,
            env=env,
            stdout=open(os.path.join(work, "recipe.log"), "w"),
            stderr=subprocess.STDOUT,
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    steps = read_steps(os.path.join(log_path, "metrics.jsonl"), KEYS[args.recipe])
    return {
        "recipe": RECIPES[args.recipe],
        "command": " ".join(["python", *recipe[1:]]).replace(str(port), "<port>"),
        "model": args.model,
        "exit_code": done.returncode,
        "wall_seconds": round(time.time() - start, 1),
        "load_average_1m_at_end": os.getloadavg()[0],
        "cores": os.cpu_count(),
        "steps": steps,
        "logs": work,
    }


def read_steps(path: str, keys: List[str]) -> List[Dict[str, Any]]:
    steps = []
    for line in open(path) if os.path.isfile(path) else []:
        record = json.loads(line)
        steps.append({"step": record.get("step"), **{k: record[k] for k in keys if k in record}})
    return steps


def summary(result: Dict[str, Any], recipe: str) -> str:
    """One line: the first key's mean over the first and the last five steps, and the median
    seconds a step took."""
    key = KEYS[recipe][0]
    values = [s[key] for s in result["steps"] if key in s]
    clock = KEYS[recipe][-1]  # each recipe's seconds per step
    seconds = sorted(s[clock] for s in result["steps"] if clock in s)
    if not values:
        return f"{recipe}: no step finished (exit {result['exit_code']}); see {result['logs']}"
    first, last = values[:5], values[-5:]
    median = seconds[len(seconds) // 2] if seconds else float("nan")
    return (
        f"{recipe}: {len(values)} steps; {key} {sum(first) / len(first):.3f} (mean of the first "
        f"{len(first)}) -> {sum(last) / len(last):.3f} (last {len(last)}); median step "
        f"{median:.1f} s, {result['wall_seconds']} s in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--python", required=True, help="an interpreter with tinker-cookbook")
    parser.add_argument("--model", required=True, help="the base model (a hub id or a folder)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("recipe_args", nargs="*", help="key=value arguments of the recipe")
    args = parser.parse_intermixed_args()
    result = run(args)
    result["summary"] = summary(result, args.recipe)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(result["summary"])


if __name__ == "__main__":
    main()
