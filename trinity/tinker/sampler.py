"""Sampling with this project's engine (``TransformersEngine``), one saved adapter at a time.

The engine holds one plain copy of the base model. A sampler's weights are an adapter's
factors (``AdapterWeights``); before a batch of samples from a sampler the engine's adapted
layers are set to ``W + scale * B @ A`` (the base weights of every layer a merge touched are
kept, so switching to another adapter, or back to the base model, is exact). Requests are
grouped by weights (and by whether the end-of-sequence token stops them) and each group is
one ``generate`` call, so samples of one sampler batch together.

Prompt logprobs (``compute_logprobs``, ``include_prompt_logprobs``) are one more forward of
the prompt through the same merged weights.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from trinity.common.models.sampling import SamplingParams
from trinity.tinker.errors import bad_field
from trinity.tinker.futures import FutureStore
from trinity.tinker.proto_codec import Sampled, SampleResult
from trinity.tinker.worker import SampleJob

_PREFIX = "base_model.model."
_MASK_LOGPROB = -99999.0  # the SDK's TopkLogprobs sentinel: a position with no value
_keys = itertools.count()


@dataclass
class AdapterWeights:
    """An adapter's factors by the base model's module name: ``(A, B, scale)``."""

    layers: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]
    key: int  # identity of these weights in the engine

    @classmethod
    def from_state(cls, state: Dict[str, torch.Tensor], alpha: float, rank: int):
        """From tensors under peft's saved names (``base_model.model.<module>.lora_A.weight``)."""
        layers = {}
        for name, a in state.items():
            if not name.endswith(".lora_A.weight"):
                continue
            module = name[len(_PREFIX) : -len(".lora_A.weight")]
            b = state[name.replace(".lora_A.", ".lora_B.")]
            layers[module] = (a, b, alpha / rank)
        return cls(layers, next(_keys))


@dataclass
class SampleRequest:
    prompt: List[int]
    params: SamplingParams
    weights: Optional[AdapterWeights]  # None: the base model
    eos: bool  # whether end-of-sequence stops it (an explicit stop list replaces it)
    prompt_logprobs: bool
    topk_prompt: int
    last_n: Optional[int]


class Sampler:
    """The engine, the weights it holds now, and a batch runner for the worker."""

    def __init__(self, engine: Any, futures: FutureStore) -> None:
        self.engine, self.futures = engine, futures
        self._eos = list(engine.eos_ids)
        self._originals: Dict[str, torch.Tensor] = {}  # base weights of merged layers
        self._current: Optional[int] = None  # key of the weights merged in (None: base)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def run_batch(self, jobs: List[SampleJob]) -> None:
        """Sample every job, completing each job's future (the worker's sampling hook)."""
        groups: Dict[Tuple[Optional[int], bool], List[SampleJob]] = collections.defaultdict(list)
        for job in jobs:
            weights = job.request.weights
            groups[(weights.key if weights else None, job.request.eos)].append(job)
        for (_, eos), group in groups.items():
            self.use(group[0].request.weights)
            self.engine.eos_ids = self._eos if eos else []
            try:
                outputs = self.engine.generate(
                    [j.request.prompt for j in group], [j.request.params for j in group]
                )
            finally:
                self.engine.eos_ids = self._eos
            for job, samples in zip(group, outputs, strict=True):
                self.futures.complete(job.future, self._result(job.request, samples))

    def _result(self, request: SampleRequest, samples: List[Any]) -> SampleResult:
        sequences = [
            Sampled(s.token_ids, s.logprobs, s.finish_reason, _topk_of(s.top_logprobs))
            for s in samples
        ]
        result = SampleResult(sequences)
        if request.prompt_logprobs or request.topk_prompt:
            lp, topk = self.prompt_scores(request.prompt, request.topk_prompt, request.last_n)
            result.prompt_logprobs = lp if request.prompt_logprobs else None
            result.topk_prompt = topk
        return result

    @torch.inference_mode()
    def prompt_scores(
        self, prompt: List[int], topk: int, last_n: Optional[int]
    ) -> Tuple[np.ndarray, Optional[Tuple[np.ndarray, np.ndarray]]]:
        """Each prompt token's logprob given the tokens before it (NaN for the first, and
        before the last ``last_n``), and the ``topk`` most likely tokens at each position."""
        model = self.engine.model
        ids = torch.tensor([prompt], device=self.engine.device)
        scores = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        n = len(prompt)
        first = 1 if last_n is None else max(1, n - last_n)
        logprobs = np.full(n, np.nan, dtype=np.float32)
        picked = scores.gather(-1, ids[0, 1:, None])[:, 0].cpu().numpy()
        logprobs[first:] = picked[first - 1 :]
        if not topk:
            return logprobs, None
        best = scores.topk(topk, dim=-1)
        top_ids = np.zeros((n, topk), dtype=np.int32)
        top_lp = np.full((n, topk), _MASK_LOGPROB, dtype=np.float32)
        top_ids[first:] = best.indices[first - 1 :].cpu().numpy()
        top_lp[first:] = best.values[first - 1 :].cpu().numpy()
        return logprobs, (top_ids, top_lp)

    @torch.no_grad()
    def use(self, weights: Optional[AdapterWeights]) -> None:
        """Make the engine's weights the base model's plus ``weights`` (None: the base)."""
        key = weights.key if weights is not None else None
        if key == self._current:
            return
        layers = weights.layers if weights is not None else {}
        for module in [m for m in self._originals if m not in layers]:
            self._weight(module).copy_(self._originals.pop(module))
        for module, (a, b, scale) in layers.items():
            weight = self._weight(module)
            base = self._originals.setdefault(module, weight.detach().clone())
            delta = (b.to(torch.float32) @ a.to(torch.float32)) * scale
            weight.copy_((base.to(torch.float32) + delta.to(base.device)).to(weight.dtype))
        self._current = key

    def _weight(self, module: str) -> torch.nn.Parameter:
        """The weight of the engine's layer ``module``; an output head tied to the input
        embeddings is untied first, so an adapted head never changes the embeddings."""
        model = self.engine.model
        try:
            layer = model.get_submodule(module)
        except AttributeError:
            raise bad_field(
                "model_path", f"the adapter adapts '{module}', which the base model lacks"
            ) from None
        embed = model.get_input_embeddings()
        if layer is model.get_output_embeddings() and layer.weight is embed.weight:
            layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        return layer.weight


def _topk_of(
    top: Optional[List[List[Tuple[int, float]]]],
) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    if top is None:
        return None
    k = max((len(step) for step in top), default=0)
    ids = np.zeros((len(top), k), dtype=np.int32)
    lps = np.full((len(top), k), _MASK_LOGPROB, dtype=np.float32)
    for t, step in enumerate(top):
        for j, (token, lp) in enumerate(step):
            ids[t, j], lps[t, j] = token, lp if math.isfinite(lp) else _MASK_LOGPROB
    return ids, lps
