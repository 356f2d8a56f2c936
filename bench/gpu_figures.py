"""The GPU check's measurements outside the stage (``gpu_check.py`` runs them): the rollout
engine against plain ``model.generate`` per batch size and decoder, logprob agreement with
the trainer, the trainer's forward and backward alone, and weight-sync times."""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

import torch
from transformers import AutoModelForCausalLM

from trinity.common.experience import Experience, ExperienceBatch
from trinity.engine.hf_engine import SamplingParams, TransformersEngine
from trinity.trainer.policy_step import micro_batches, response_logprobs
from trinity.utils.device import compute_in


def decoders(device: torch.device) -> List[str]:
    """The engine's decoders a device runs: CUDA graphs need a CUDA device."""
    return ["auto", "static"] + (["graphs"] if device.type == "cuda" else [])


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


def build_engine(model: str, device: torch.device, args: Any, decoder: str) -> TransformersEngine:
    length = args.response_tokens
    return TransformersEngine(
        model,
        max_model_len=64 + length,
        max_prompt_tokens=64,
        max_response_tokens=length,
        min_response_tokens=length,  # every row the same length, as generate's below
        dtype="bfloat16" if device.type == "cuda" else "float32",
        device=str(device),
        decoder=decoder,
    )


def chat_prompts(engine: TransformersEngine, tasks: int) -> List[List[int]]:
    questions = [f"{10 + i}+{40 + i}=" for i in range(tasks)]
    return [engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions]


def engine_figures(model: str, device: torch.device, args: Any) -> Dict[str, Any]:
    """Per decoder: tokens/s at each of ``--batches`` rows against plain ``generate`` at the
    same rows, peak memory, and the logprob agreement of its samples (``--tasks`` x
    ``--repeat`` rows) with the trainer; then the trainer's pass and the weight-sync times."""
    length = args.response_tokens
    # The trainer's view of the samples: fp32 master weights under bf16 autocast.
    trainer_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    compute_in(trainer_model, torch.bfloat16 if device.type == "cuda" else torch.float32)
    report: Dict[str, Any] = {"engine": {"response_tokens": length, "batches": {}}}
    auto = None  # the default decoder's engine: the sync figures and the trainer's samples
    for decoder in decoders(device):
        reset_peak(device)
        try:  # a decoder that fails leaves the others' figures (a GPU is lent for minutes)
            engine, prompts, outputs = decoder_figures(model, device, args, decoder, report)
        except Exception:
            report.setdefault("decoder_errors", {})[decoder] = traceback.format_exc()
            continue
        report.setdefault("logprobs", {})[decoder] = logprob_agreement(
            trainer_model, prompts, outputs, engine.pad_id
        )
        if decoder == "auto":
            auto, samples = engine, (prompts, outputs)
        del engine  # a static decoder's buffers go before the next engine's come
    for rows in args.batches:
        prompts = chat_prompts(auto, rows // args.repeat)
        tokens_per_s = rows * length / generate_seconds(model, device, prompts, auto.pad_id, args)
        figures = report["engine"]["batches"][str(rows)]
        figures["generate"] = tokens_per_s
        figures["speedup_vs_generate"] = {
            d: figures[d] / tokens_per_s for d in decoders(device) if d in figures
        }
    report["trainer_pass"] = trainer_pass_figures(trainer_model, *samples, auto.pad_id, args)
    report["sync"] = sync_figures(auto, trainer_model.state_dict())
    return report


def decoder_figures(
    model: str, device: torch.device, args: Any, decoder: str, report: Dict[str, Any]
) -> Tuple[TransformersEngine, List[List[int]], List[Any]]:
    """Into ``report``: the engine's tokens/s with ``decoder`` at each of ``--batches`` rows
    and its peak memory; returns the engine and its samples of ``--tasks`` prompts."""
    engine = build_engine(model, device, args, decoder)
    for rows, rate in engine_rates(engine, args).items():
        report["engine"]["batches"].setdefault(str(rows), {})[decoder] = rate
    report["engine"].setdefault("peak_memory_gb", {})[decoder] = peak_gb(device)
    prompts = chat_prompts(engine, args.tasks)
    params = [SamplingParams(n=args.repeat, temperature=1.0, max_tokens=args.response_tokens)]
    return engine, prompts, engine.generate(prompts, params * args.tasks)


def engine_rates(engine: TransformersEngine, args: Any) -> Dict[int, float]:
    """Tokens/s of ``engine`` sampling each of ``--batches`` rows (``--repeat`` per prompt)."""
    rates = {}
    for rows in args.batches:
        prompts = chat_prompts(engine, rows // args.repeat)
        params = [SamplingParams(n=args.repeat, temperature=1.0, max_tokens=args.response_tokens)]
        seconds = best_of(lambda p=prompts, q=params: engine.generate(p, q * len(p)), args.repeats)
        rates[rows] = rows * args.response_tokens / seconds
    return rates


def sync_figures(engine: TransformersEngine, state: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Seconds to publish (the trainer's copy), load, and release and reload the weights."""
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
        "trainer_publish_s": publish_s,
        "engine_load_s": load_s,
        "engine_release_s": min(release_s),
        "engine_reload_after_release_s": min(restore_s),
        "released_gb": freed / 1e9,
    }


def generate_seconds(
    model: str,
    device: torch.device,
    prompts: List[List[int]],
    pad: int,
    args: Any,
) -> float:
    """Best time of plain ``model.generate`` sampling the engine's rows at the same lengths."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the engine's
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
