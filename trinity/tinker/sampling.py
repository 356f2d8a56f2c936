"""The sampling call: ``asample`` (``SamplingClient.sample`` and ``compute_logprobs``).

The request is checked on the event loop (a 400 naming the field), turned into the engine's
``SamplingParams`` and queued for the worker, which batches it with the other samples of the
same weights (``sampler.py``).

``stop``: None keeps the model's end-of-sequence tokens as the stops; a list replaces them
(token ids, or strings matched in the decoded text), and ``[]`` stops only at ``max_tokens``,
as the SDK documents.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from trinity.common.models.sampling import SamplingParams
from trinity.tinker import wire
from trinity.tinker.errors import TinkerError, bad_field
from trinity.tinker.sampler import SampleRequest
from trinity.tinker.service import TinkerService
from trinity.tinker.sessions import SamplerRecord

# Request fields this server does not serve, and why (the SDK sends their defaults always).
_REFUSED = {
    "target_prompt_logprobs": "logprobs of chosen ids at prompt positions",
    "prompt_alt_tokens_k": "draws of alternative prompt tokens",
    "record_stability_info": "stability information (stable_reinforce)",
}


def asample(service: TinkerService, body: wire.Sample) -> Dict[str, Any]:
    """``POST /api/v1/asample``: a future of a ``SampleResponse``, and the sequences' ids."""
    record = _sampler(service, body)
    for name, what in _REFUSED.items():
        if getattr(body, name):
            raise bad_field(name, f"{what} is not supported by this server")
    prompt = wire.prompt_tokens(body.prompt, "prompt")
    _check_prompt(prompt, service)
    if body.num_samples > service.max_samples:
        raise bad_field(
            "num_samples",
            f"{body.num_samples}; this server samples at most {service.max_samples} per "
            "request (--max-samples)",
        )
    last_n = body.prompt_logprobs_last_n
    if last_n is not None and last_n > len(prompt) - 1:
        raise bad_field(
            "prompt_logprobs_last_n",
            f"{last_n} is more than the prompt's {len(prompt)} tokens minus one",
        )
    params, eos = engine_params(body)
    request = SampleRequest(
        prompt=prompt,
        params=params,
        weights=record.weights,
        eos=eos,
        prompt_logprobs=bool(body.prompt_logprobs),
        topk_prompt=body.topk_prompt_logprobs,
        last_n=last_n,
    )
    future = service.futures.create("Sample")
    service.worker.submit_sample(future, request)
    ids = [f"{future.request_id}:{i}" for i in range(body.num_samples)]
    return {"request_id": future.request_id, "model_id": None, "sample_sequence_ids": ids}


def _sampler(service: TinkerService, body: wire.Sample) -> SamplerRecord:
    """The sampler a request names: its sampling session, else a path or the base model."""
    if body.sampling_session_id is not None:
        record = service.registry.sampler(body.sampling_session_id)
        if record.expired:
            raise TinkerError(
                410,
                f"sampling_session_id: '{record.sampler_id}' has expired: its training model "
                "saved newer weights for sampling since (the server keeps the latest few); "
                "sample from a newer sampling client",
                "sampling_session_id",
            )
        return record
    if body.model_path is not None:
        weights = service.weights_at(body.model_path, "model_path")
        return SamplerRecord("", "", service.served.name, body.model_path, weights)
    if body.base_model is None:
        raise bad_field("sampling_session_id", "required (or model_path, or base_model)")
    service.served.check(body.base_model, "base_model")
    return SamplerRecord("", "", service.served.name, None)


def _check_prompt(prompt: List[int], service: TinkerService) -> None:
    limit = service.served.max_model_len
    if not 0 < len(prompt) < limit:
        raise bad_field("prompt", f"{len(prompt)} tokens; 1 to {limit - 1} leave room to sample")
    vocab = service.trainer.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise bad_field("prompt", f"token ids outside [0, {vocab}): {bad[:5]}")


def engine_params(body: wire.Sample) -> tuple:
    """The engine's ``SamplingParams`` for the request, and whether eos stops it."""
    sp = body.sampling_params
    stop = sp.stop
    stop_ids: Optional[List[int]] = None
    stop_strs: Optional[List[str]] = None
    if isinstance(stop, str):
        stop_strs = [stop]
    elif stop and isinstance(stop[0], int):
        stop_ids = list(stop)
    elif stop:
        stop_strs = list(stop)
    params = SamplingParams(
        n=body.num_samples,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        max_tokens=sp.max_tokens,
        min_tokens=0,
        stop_token_ids=stop_ids,
        stop=stop_strs,
        top_logprobs=body.topk_sample_logprobs,
        truncate_prompt=False,
        seed=sp.seed,
    )
    return params, stop is None
