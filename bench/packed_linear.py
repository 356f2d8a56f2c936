"""The transformers engine's decode step two ways, alternating in one process: with its linear
weights packed for oneDNN and without (``--compare packed``: ``trinity/ops/packed_linear.py``),
through its own forward for Llama-shaped models and through transformers' (``--compare
forward``: ``trinity/ops/llama_forward.py``, both with packed weights), or with its
one-token attention as one softmax and as the multi-token cascade's two merged softmaxes
(``--compare decode``: ``trinity/ops/decode_attention.py``).

One engine per dtype; each round decodes the same requests once per side, in alternating
order, so machine noise falls on both. A request set is ``--prompts`` word problems x
``--samples`` samples (rows = their product), each row decoded to exactly ``--tokens``
tokens (``min_tokens = max_tokens``), so both sides decode the same rows for the same number
of steps. Reported: the median seconds of a decode step per row count and dtype, and their
ratio (second side over first). It measures; it asserts nothing.

Usage::

    python bench/packed_linear.py --model ./smollm2/model --data ./smollm2/data/rl/train.jsonl \
        --out docs/results/packed_linear.json
    python bench/packed_linear.py --compare forward --dtypes bfloat16 --out own_forward.json
    python bench/packed_linear.py --compare decode --dtypes bfloat16 --out decode_attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from typing import Any, Dict, List

import torch

from trinity.common.models.sampling import SamplingParams
from trinity.engine.hf_engine import TransformersEngine
from trinity.ops import attention, llama_forward
from trinity.utils import allocator


def decode_seconds(engine: TransformersEngine, prompts: List[List[int]], samples: int, tokens: int):
    """Seconds a decode step (a ``generate`` call's wall time over its steps)."""
    params = SamplingParams(n=samples, temperature=1.0, max_tokens=tokens, min_tokens=tokens)
    start = time.perf_counter()
    engine.generate(prompts, [params] * len(prompts))
    return (time.perf_counter() - start) / tokens


def set_packed(model: torch.nn.Module, packed: bool, forwards: Dict[torch.nn.Module, Any]) -> None:
    """Route the packed layers through their packed weights, or back to ``nn.Linear``'s own
    forward (the instance attribute ``pack_linears`` set, removed)."""
    for module, forward in forwards.items():
        if packed:
            module.forward = forward
        else:
            vars(module).pop("forward", None)


_OWN_FORWARD = llama_forward.of
_DECODE = attention.decode_attention
SIDES = {
    "packed": ("packed", "plain"),
    "forward": ("own", "transformers"),
    "decode": ("one_softmax", "merged"),
}


def _merged_decode(cache: Any, layer_idx: int, query: torch.Tensor, scaling: float):
    """A decode step's attention through the multi-token cascade (two softmaxes merged)."""
    layer = cache.layers[layer_idx]
    return attention._cascade_attention(cache, layer_idx, query, layer.keys, layer.values, scaling)


def use(side: str, model: torch.nn.Module, forwards: Dict[torch.nn.Module, Any]) -> None:
    """Make the engine decode as ``side`` says (one of ``SIDES``' names)."""
    set_packed(model, side != "plain", forwards)
    # The decoder asks ``llama_forward.of`` for the model's own forward at each batch.
    llama_forward.of = (lambda model: None) if side == "transformers" else _OWN_FORWARD
    attention.decode_attention = _merged_decode if side == "merged" else _DECODE


def measure(args: argparse.Namespace, dtype: str, questions: List[str]) -> Dict[str, Any]:
    engine = TransformersEngine(
        args.model,
        dtype=dtype,
        num_threads=args.threads,
        max_model_len=args.tokens + 160,
        max_prompt_tokens=160,
        max_response_tokens=args.tokens,
    )
    forwards = {m: vars(m)["forward"] for m in engine.model.modules() if "forward" in vars(m)}
    prompts = [engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    result: Dict[str, Any] = {"packed_layers": len(forwards), "rows": {}}
    first, second = SIDES[args.compare]
    for n_prompts, samples in args.shapes:
        times: Dict[str, List[float]] = {first: [], second: []}
        decode_seconds(engine, prompts[:n_prompts], samples, args.tokens)  # warm-up
        for r in range(args.rounds):
            for side in (first, second) if r % 2 == 0 else (second, first):
                use(side, engine.model, forwards)
                times[side].append(
                    decode_seconds(engine, prompts[:n_prompts], samples, args.tokens)
                )
        use(first, engine.model, forwards)
        medians = {side: statistics.median(t) for side, t in times.items()}
        result["rows"][n_prompts * samples] = {
            "step_ms": {side: round(1000 * m, 2) for side, m in medians.items()},
            f"{second}_over_{first}": round(medians[second] / medians[first], 3),
            "runs_ms": {side: [round(1000 * t, 2) for t in ts] for side, ts in times.items()},
        }
        print(
            dtype, n_prompts * samples, result["rows"][n_prompts * samples]["step_ms"], flush=True
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="./smollm2/model", help="prepare-quickstart's")
    parser.add_argument("--data", default="./smollm2/data/rl/train.jsonl")
    parser.add_argument("--compare", choices=sorted(SIDES), default="packed")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument(
        "--shapes", default="1x1,1x8,8x8", help="prompts x samples, comma-separated"
    )
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per row")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    args.shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    allocator.tune()
    with open(args.data) as f:
        questions = [json.loads(line)["question"] for line in f][: max(p for p, _ in args.shapes)]
    load_start = os.getloadavg()[0]
    result = {
        "what": "decode step of the transformers engine: "
        + {
            "packed": "linears packed for oneDNN vs F.linear",
            "forward": "its own forward vs transformers' (weights packed on both sides)",
            "decode": "one-token attention as one softmax vs the cascade's two merged",
        }[args.compare],
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "model": args.model,
        "tokens_per_row": args.tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "dtypes": {dtype: measure(args, dtype, questions) for dtype in args.dtypes},
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
