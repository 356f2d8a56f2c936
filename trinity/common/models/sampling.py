"""``SamplingParams``: how to sample one request, the same for every engine.

Workflows set these through ``ModelWrapper`` (its keyword arguments), the OpenAI-compatible
server from request bodies; each engine reads them its own way (the transformers engine:
``trinity/engine/sampling.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from trinity.common.config.schema_buffer import MAX_TOP_LOGPROBS


@dataclass
class SamplingParams:
    """How to sample one request; ``None`` limits fall back to the engine's defaults."""

    n: int = 1  # samples per prompt; they share one prefill
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # <= 0: no top-k limit
    max_tokens: Optional[int] = None  # None: the engine's max_response_tokens
    min_tokens: Optional[int] = None  # None: the engine's min_response_tokens
    logprobs: bool = True  # kept for API parity: logprobs are always computed (they are free)
    stop_token_ids: Optional[List[int]] = None  # stop on these as well as on eos
    stop: Optional[List[str]] = None  # stop once the response text contains one of these
    top_logprobs: int = 0  # also return this many most likely tokens (and logprobs) per step
    truncate_prompt: bool = True  # False: never cut the prompt (the OpenAI API, multi-turn)
    seed: Optional[int] = None  # fixes this request's samples regardless of batch company

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens is not None and self.min_tokens < 0:
            raise ValueError(f"SamplingParams.min_tokens must be >= 0, got {self.min_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(
                f"SamplingParams.top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                f"got {self.top_logprobs}"
            )
        # Engines put these in int64 tensors and seed generators with them: a value out of
        # range would fail the whole batch a request joined, not just that request.
        for name in ("top_k", "min_tokens", "max_tokens"):
            value = getattr(self, name)
            if value is not None and not -(2**31) < value < 2**31:
                raise ValueError(
                    f"SamplingParams.{name} must be within (-2**31, 2**31), got {value}"
                )
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"SamplingParams.seed must fit in 64 bits, got {self.seed}")
        if self.stop is not None and not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be non-empty strings, got {self.stop!r}")
