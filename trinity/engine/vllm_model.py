"""``engine_type: vllm``: vLLM behind the batching, conversations and experiences of the
transformers engine's ``InferenceModel`` (``vllm_engine.VLLMEngine`` has the same surface).

vLLM is an optional install (docs/guides/vllm.md); this module only names it, so registering
the engine costs nothing where vLLM is absent, and the checks before start say how to install
it when a config asks for it.
"""

from __future__ import annotations

from typing import Any

from trinity.common.config.schema_explorer import VLLM_KEYS
from trinity.engine.registry import ENGINES
from trinity.engine.transformers_model import TransformersInferenceModel


@ENGINES.register_module("vllm")
class VLLMInferenceModel(TransformersInferenceModel):
    """Requests batched into ``VLLMEngine.generate`` calls (vLLM schedules each batch)."""

    config_keys = VLLM_KEYS

    @staticmethod
    def build_engine(**engine_kwargs: Any) -> Any:
        from trinity.engine.vllm_engine import VLLMEngine

        return VLLMEngine(**engine_kwargs)
