"""What the Tinker API adds to a training step: the same forward_backward + optim_step through
the SDK (HTTP, protobuf, futures polled) and called in-process on the service's trainer.

One ``TinkerServer`` in this process; two LoRA models on its base model; ``--steps`` steps of
``--data`` RL datums (importance_sampling, ``--tokens`` tokens each) on each path, in turns.

    python bench/tinker_overhead.py --model ./smollm2/model --out docs/results/tinker_overhead.json

It measures, never asserts. It needs the ``tinker`` extra (``pip install -e ".[tinker]"``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tinker  # noqa: E402
from tinker import types  # noqa: E402

from trinity.tinker import ServeOptions, TinkerServer  # noqa: E402
from trinity.tinker.losses import LOSSES  # noqa: E402
from trinity.tinker.proto_codec import Datum  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--data", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    server = TinkerServer(ServeOptions(args.model, port=0, state_dir=tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    vocab = server.service.trainer.vocab_size
    rows = [rng.integers(0, vocab, args.tokens + 1).tolist() for _ in range(args.data)]
    zeros = np.zeros(args.tokens, np.float32)
    advantages = rng.normal(size=args.tokens).astype(np.float32)
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
        sdk = client.create_lora_training_client(base_model=args.model, rank=32, seed=0).result()
        local = client.create_lora_training_client(base_model=args.model, rank=32, seed=0).result()
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(r[:-1]),
                loss_fn_inputs={
                    "target_tokens": r[1:],
                    "logprobs": zeros,
                    "advantages": advantages,
                },
            )
            for r in rows
        ]
        plain = [
            Datum(
                r[:-1],
                {"target_tokens": np.asarray(r[1:]), "logprobs": zeros, "advantages": advantages},
            )
            for r in rows
        ]
        adam = types.AdamParams(learning_rate=1e-4)
        through_sdk, in_process = [], []
        trainer = server.service.trainer
        for _ in range(args.steps):
            start = time.perf_counter()
            future = sdk.forward_backward(data, "importance_sampling")
            step = sdk.optim_step(adam)
            future.result(), step.result()
            through_sdk.append(time.perf_counter() - start)
            start = time.perf_counter()  # the worker is idle: the trainer is this thread's
            trainer.forward_backward(local.model_id, plain, LOSSES["importance_sampling"], {}, True)
            trainer.optim_step(local.model_id, adam)
            in_process.append(time.perf_counter() - start)
        client.close("success").result()
    finally:
        server.close()
    result = {
        "model": args.model,
        "datums": args.data,
        "tokens_per_datum": args.tokens,
        "sdk_seconds": through_sdk,
        "in_process_seconds": in_process,
        "load_average_1m": os.getloadavg()[0],
        "summary": f"forward_backward + optim_step of {args.data}x{args.tokens} tokens: "
        f"{statistics.median(through_sdk):.2f} s through the SDK, "
        f"{statistics.median(in_process):.2f} s in-process (medians of {args.steps})",
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(result["summary"])


if __name__ == "__main__":
    main()
