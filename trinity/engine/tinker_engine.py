"""``engine_type: tinker``: sample through a Tinker service's sampling clients (the SDK).

The run's trainer trains a LoRA adapter in the service (``model.tinker.enable``,
``trinity/trainer/tinker_client.py``); each weight sync hands the explorer the path that
``save_weights_for_sampler`` returned, and the engine samples with a sampling client of that
path, so an experience's logprobs are the service's sampler's and its ``model_version`` the
step whose weights sampled it. Before the first sync it samples the base model
(``model.tinker.base_model``).

``TinkerSampler`` has the surface of the local engines (``PromptSide``: tokenizer, chat
template, limits, eos ids; ``generate`` over token ids), so the transformers engine's
batching, conversations, experiences and OpenAI-compatible serving run over it unchanged
(``TinkerInferenceModel``). Prompts are rendered with the local tokenizer at ``model_path``:
the service samples token ids, and the trainer trains on those same ids.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from trinity.common.models.sampling import SamplingParams
from trinity.engine.prompts import PromptSide
from trinity.engine.registry import ENGINES
from trinity.engine.tinker_service import service_client, wait_result
from trinity.engine.transformers_model import TransformersInferenceModel

logger = logging.getLogger(__name__)


class TinkerSampler(PromptSide):
    """Sample from the service's current sampling client (the base model until ``use``)."""

    def __init__(
        self,
        model_path: str,
        *,
        base_model: str,
        repetition_penalty: float = 1.0,
        adapter_path: Optional[str] = None,
        **prompt_side: Any,
    ) -> None:
        """``model_path``: the local tokenizer; ``base_model``: the model's name on the
        service. Local-engine arguments (``dtype``, ``device``, ``seed``, ``num_threads``)
        are accepted and unused: the service runs the model."""
        if repetition_penalty != 1.0:  # refused before start (preflight); kept for direct use
            raise ValueError("the Tinker API has no repetition penalty; set it to 1.0")
        if adapter_path is not None:
            raise ValueError("the tinker engine samples the service's adapter, not a local one")
        for unused in ("dtype", "device", "seed", "num_threads"):
            prompt_side.pop(unused, None)
        super().__init__(model_path, **prompt_side)
        self.base_model = base_model
        # token ids a request may name (the OpenAI server checks them): the tokenizer's
        self.vocab_size = len(self.tokenizer)
        self.service = service_client()  # the service answered: its URL is right
        # Sampling clients are made on the generation thread (``use``, ``generate``): the SDK
        # refuses to block an event loop, and the engine is built on its host's loop.
        self.sampler: Any = None
        self.where = f"the base model {base_model}"

    def use(self, path: Optional[str]) -> None:
        """Sample from now on with the weights the trainer saved at ``path`` (None: the base
        model)."""
        make = self.service.create_sampling_client
        future = make(model_path=path) if path else make(base_model=self.base_model)
        where = path or f"the base model {self.base_model}"
        self.sampler = wait_result(future, f"creating a sampling client of {where}")
        self.where = where

    def release(self) -> int:
        """Nothing to free here: the service holds the weights."""
        return 0

    def generate(self, prompts: List[List[int]], params: List[SamplingParams]) -> List[List[Any]]:
        """Sample ``params[i].n`` responses to each ``prompts[i]``: every request is sent
        first, then each is awaited."""
        from tinker import types

        fitted = [self.fit(list(x), p) for x, p in zip(prompts, params, strict=True)]
        if self.sampler is None:
            self.use(None)
        futures = [
            self.sampler.sample(
                prompt=types.ModelInput.from_ints(prompt),
                num_samples=p.n,
                sampling_params=self._sampling(p),
                topk_sample_logprobs=p.top_logprobs,
            )
            for prompt, p in fitted
        ]
        return [
            [
                self._output(seq, prompt, p)
                for seq in wait_result(f, f"sampling {self.where}").sequences
            ]
            for f, (prompt, p) in zip(futures, fitted, strict=True)
        ]

    def _sampling(self, params: SamplingParams) -> Any:
        """``params`` as the API's ``SamplingParams``. Its ``stop`` is either strings or ids:
        without stop strings the ids are the eos ids and ``stop_token_ids`` (what the local
        engines stop on); with them, an eos is cut after sampling (``_output``)."""
        from tinker import types

        if params.min_tokens and params.min_tokens > 1:
            raise ValueError(
                f"min_tokens {params.min_tokens}: the Tinker API has no minimum length"
            )
        if params.stop and params.stop_token_ids:
            raise ValueError("the Tinker API takes stop strings or stop token ids, not both")
        stop: Any = (
            list(params.stop)
            if params.stop
            else sorted(set(self.eos_ids) | set(params.stop_token_ids or []))
        )
        return types.SamplingParams(
            max_tokens=params.max_tokens,
            seed=params.seed,
            stop=stop,
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1,
            top_p=params.top_p,
        )

    def _output(self, sequence: Any, prompt: List[int], params: SamplingParams) -> Any:
        """A sampled sequence as the local engines' ``SampleOutput``, ended at its first eos
        (a prefix of a sample is the sample the local engines would have stopped at)."""
        from trinity.engine.hf_engine import SampleOutput

        tokens, logprobs = list(sequence.tokens), sequence.logprobs
        if logprobs is None or len(logprobs) != len(tokens):
            raise RuntimeError(f"{self.where} returned no logprob for every sampled token")
        top = sequence.topk_logprobs if params.top_logprobs else None
        reason = sequence.stop_reason
        end = _first_eos(tokens, self.eos_ids)
        if end is not None and end + 1 < len(tokens):
            tokens, logprobs, reason = tokens[: end + 1], logprobs[: end + 1], "stop"
            top = top[: end + 1] if top is not None else None
        return SampleOutput(
            token_ids=tokens,
            logprobs=list(logprobs),
            finish_reason=reason,
            prompt_token_ids=prompt,
            top_logprobs=_pairs(top) if top is not None else None,
        )


def _first_eos(tokens: List[int], eos_ids: List[int]) -> Optional[int]:
    return next((i for i, t in enumerate(tokens) if t in eos_ids), None)


def _pairs(top: List[Optional[List[Tuple[int, float]]]]) -> List[List[Tuple[int, float]]]:
    return [[(int(t), float(v)) for t, v in step or []] for step in top]


@ENGINES.register_module("tinker")
class TinkerInferenceModel(TransformersInferenceModel):
    """The transformers engine's batching and experiences over a ``TinkerSampler``; weights
    arrive as the service paths the trainer saved (``load_weights``)."""

    # run config values this engine takes besides a hosted engine's (explorer_role.py)
    config_paths: Dict[str, str] = {"base_model": "model.tinker.base_model"}

    @staticmethod
    def build_engine(**engine_kwargs: Any) -> Any:
        return TinkerSampler(**engine_kwargs)

    def _load(self, weights: Any, version: int) -> None:
        """On the generation thread: a batch's version is the weights that sampled it."""
        self.engine.use(weights)
        self._version = version

    async def load_weights(self, weights: Any, version: int) -> None:
        """``weights``: the ``save_weights_for_sampler`` path of model version ``version``."""
        if not isinstance(weights, str):
            raise TypeError(f"the tinker engine loads a sampler path, got {type(weights).__name__}")
        self._loading = version
        try:
            await self._exclusive(self._load, weights, version)
        finally:
            self._loading = None
        logger.info("rollout engine now at model version %d (%s)", version, weights)
