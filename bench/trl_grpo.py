"""The TRL half of ``grpo_vs_trl.py``: TRL's ``GRPOTrainer`` with the shared hyperparameters,
a held-out greedy eval on Trinity's cadence, and the timings the report compares. TRL comes
with the ``bench`` extra (``pip install -e ".[bench]"``)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import time
from typing import Any, Dict, List


def greedy_accuracy(
    model: Any, tokenizer: Any, rows: List[Dict], max_tokens: int, reward: str
) -> float:
    """Held-out accuracy: greedy answers to every question, scored by ``reward``."""
    import torch
    from transformers import GenerationConfig

    from trinity.common.rewards import REWARD_FUNCTIONS

    score, was_training = REWARD_FUNCTIONS.get(reward)(), model.training
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, **ids)
    messages = [[{"role": "user", "content": r["question"]}] for r in rows]
    texts = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    model.eval()
    correct = 0.0
    with torch.no_grad():
        for i in range(0, len(texts), 100):
            enc = tokenizer(texts[i : i + 100], return_tensors="pt", padding=True)
            out = model.generate(**enc, generation_config=gen)[:, enc["input_ids"].shape[1] :]
            for row, tokens in zip(rows[i : i + 100], out, strict=True):
                answer = tokenizer.decode(tokens, skip_special_tokens=True)
                correct += score(answer, truth=row["answer"])["accuracy"]
    model.train(was_training)
    return correct / len(rows)


def reward_fn(name: str) -> Any:
    """A TRL reward function: the project's registered reward ``name`` on each completion."""
    from trinity.common.rewards import REWARD_FUNCTIONS

    score = REWARD_FUNCTIONS.get(name)()

    def reward(completions: List[Any], answer: List[str], **_: Any) -> List[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(t, truth=truth)["accuracy"] for t, truth in zip(texts, answer, strict=True)]

    reward.__name__ = name  # TRL names its reward metrics after the function
    return reward


def heldout_callback(tokenizer: Any, rows: List[Dict], params: Dict) -> Any:
    """A ``TrainerCallback`` that evaluates on Trinity's cadence and times the loop."""
    from transformers import TrainerCallback

    interval, max_tokens = params["eval_interval"], params["max_response_tokens"]

    class HeldOutEval(TrainerCallback):
        def __init__(self) -> None:
            self.curve: List[List[float]] = []
            self.eval_s = self.excluded = self.loop_s = self.loop_start = 0.0

        def evaluate(self, model: Any, step: int, x: float) -> None:
            start = time.monotonic()
            accuracy = greedy_accuracy(model, tokenizer, rows, max_tokens, params["reward"])
            self.curve.append([step, step * params["samples_per_step"], x, accuracy])
            spent = time.monotonic() - start
            self.eval_s += spent
            self.excluded += spent if step else 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.evaluate(kw["model"], 0, 0.0)
            self.loop_start = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step, x = state.global_step, time.monotonic() - self.loop_start - self.excluded
            if step == state.max_steps:
                self.loop_s = x
            if step % interval == 0 or step == state.max_steps:
                self.evaluate(kw["model"], step, x)

    return HeldOutEval()


def trl_config(params: Dict, output_dir: str) -> Any:
    """``GRPOConfig`` with our hyperparameters; one optimizer step = 16 prompts x 8 samples.

    TRL 1.16 counts ``per_device_train_batch_size`` in completions; each generation batch
    (``generation_batch_size`` completions, ``/ num_generations`` prompts) is split into
    ``steps_per_generation`` (default ``gradient_accumulation_steps``) micro-steps. With
    128 / 1 / 128 each optimizer step generates and trains on exactly the 128 completions of
    16 prompts in one forward/backward, like Trinity's single token-packed micro-batch.
    """
    from trl import GRPOConfig

    n, clip = params["samples_per_step"], params["clip_range"]
    kw = dict(
        output_dir=output_dir, max_steps=params["steps"], logging_steps=params["eval_interval"]
    )
    kw.update(per_device_train_batch_size=n, gradient_accumulation_steps=1, generation_batch_size=n)
    kw.update(num_generations=params["samples_per_prompt"], shuffle_dataset=False)
    kw.update(max_completion_length=params["max_response_tokens"], top_p=1.0, top_k=0)
    kw.update(temperature=params["temperature"], beta=0.0, num_iterations=1)
    # loss_type "dapo" divides the summed token losses by the batch's tokens: our token-mean.
    kw.update(loss_type="dapo", scale_rewards="group", epsilon=clip[0], epsilon_high=clip[1])
    kw.update(learning_rate=params["lr"], lr_scheduler_type="constant", warmup_steps=0)
    kw.update(weight_decay=params["weight_decay"], adam_epsilon=params["adam_eps"])
    kw.update(adam_beta1=params["betas"][0], adam_beta2=params["betas"][1])
    # bf16: autocast over fp32 weights, as Trinity's trainer (mixed_precision.param_dtype bf16)
    kw.update(max_grad_norm=params["grad_clip"], use_cpu=True, bf16=params["bf16"])
    kw.update(seed=params["seed"])
    # TRL turns activation checkpointing on by default; the quickstart turns it off for us.
    # transformers 5.24 renamed the key (gradient_checkpointing stays, deprecated); vLLM's
    # CPU build pins transformers below 5.20, which has only the old name.
    names = {field.name for field in dataclasses.fields(GRPOConfig)}
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    kw.update({key: False}, report_to="none", save_strategy="no")
    return GRPOConfig(**kw, disable_tqdm=True)


def train(checkpoint: str, rl_path: str, params: Dict, optimizer_config: Any, workdir: str) -> Dict:
    """TRL's GRPO from ``checkpoint`` on the quickstart data: timings and the accuracy curve."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from trinity.algorithm.optimizer import build_optimizer
    from trinity.demo.synthetic import read_jsonl

    train = read_jsonl(os.path.join(rl_path, "train.jsonl"))
    # Trinity's sequential reader runs on across epochs: step k reads rows 16k..16k+15 (mod n).
    ordered = [train[i % len(train)] for i in range(params["steps"] * params["prompts_per_step"])]
    prompts = [[{"role": "user", "content": r["question"]}] for r in ordered]
    dataset = Dataset.from_dict({"prompt": prompts, "answer": [r["answer"] for r in ordered]})
    test = read_jsonl(os.path.join(rl_path, "test.jsonl"))
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    # generation continues the prompts' ends: pad on the left (SmolLM2's tokenizer pads right)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    optimizer = build_optimizer(model.parameters(), optimizer_config)
    callback = heldout_callback(tokenizer, test, params)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn(params["reward"]),
        args=trl_config(params, os.path.join(workdir, "trl")),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[callback],
        optimizers=(optimizer, None),  # None: TRL builds its "constant" scheduler
    )
    trainer.train()
    wall = time.monotonic() - start
    torch.set_num_threads(threads)
    c, steps = callback, trainer.state.global_step
    timing = dict(startup_s=c.loop_start - start, loop_s=c.loop_s, eval_s=c.eval_s, curve=c.curve)
    settings = {"torch_threads": os.cpu_count(), "trl": importlib.metadata.version("trl")}
    return dict(wall_s=wall, steps=steps, **timing, settings=settings)
