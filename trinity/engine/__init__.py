"""Rollout engines and what sits in front of them (docs/design-notes.md, "Code layout").

- ``conversation``: token-exact multi-turn prompts (each turn continues the previous turn's
  sampled tokens), used wherever conversations reach an engine.
- ``server``: the OpenAI-compatible HTTP API over any engine (``build_app`` over a
  ``ServedModel``; ``RunningServer`` serves it on the running event loop), with
  ``openai_protocol`` (request bodies -> ``SamplingParams``, replies, errors) and
  ``tool_calls`` (tool calls written in a reply's text -> OpenAI ``tool_calls``). The clients
  that record replies are ``ModelWrapper``'s (``trinity/common/models/client.py``).
- ``external``: an OpenAI-compatible API in place of an engine (``engine_type: external``),
  as an auxiliary model's clients or as the rollout model of an explore-only run.
- ``standalone``: one local model served over the API in a process of its own.
- ``registry``: ``ENGINES``, the engine classes by ``engine_type``; ``transformers``
  (``transformers_model``: batching over ``hf_engine``'s ``TransformersEngine``, with
  ``decoding`` and ``sampling``; ``static_decoding`` is its fixed-shape decoder for CUDA
  graphs), ``vllm`` (``vllm_model``: the same batching over
  ``vllm_engine``'s ``VLLMEngine``, with ``vllm_worker`` inside vLLM's processes) and
  ``external`` are registered below. ``prompts.PromptSide`` is what the two local engines share:
  tokenizer, chat template, limits, stop ids.
- ``tinker_engine``: ``engine_type: tinker``, the same batching over a Tinker service's
  sampling clients (the adapter a ``model.tinker`` run trains there), with
  ``tinker_service`` (where the service is, a bounded probe, waits that end when it stops
  answering), which the trainer's Tinker client (``trinity/trainer/tinker_client.py``) uses too.
- ``local``: ``LocalEngine``, the in-process host of an engine (the Ray host is
  ``runtime/actors.py: EngineActor``).

Extending: a new engine is one file: a subclass of ``trinity.common.models.model.
InferenceModel`` (``chat``, ``generate``, ``generate_ids``, ``load_weights``,
``model_version``; ``release`` too for ``mode: colocate``) decorated with
``@ENGINES.register_module("name")``, in a ``--plugin-dir`` folder for a plugin or here (then
imported below) for a built-in; ``engine_type: name`` selects it. Both hosts build it as
``cls(**kwargs)`` with the keys of ``runtime/explorer_role.py: engine_kwargs``
(``model_path``, ``dtype``, ``seed``, ``device``, the length limits...) plus ``num_threads``,
the fields of the served model's section named in its ``config_keys`` (vllm's memory keys),
and the values its ``config_paths`` name elsewhere in the config (tinker's
``model.tinker.base_model``). A client of a model served elsewhere sets ``hosted = False`` and
is built like ``external``. Worked example: docs/extending.md. An engine the OpenAI-compatible
server can serve (``enable_openai_api``, auxiliary models, mode serve) has
``served_model(name)`` returning a ``server.ServedModel`` (its ``generate_ids``, tokenizer
functions and ``max_model_len``), as the transformers and vllm engines do through
``ServedModel.from_transformers``. Another tool-call format is a function with the parsers'
contract in ``tool_calls.TOOL_CALL_PARSERS`` and a value of ``tool_call_parser``'s
``Literal``; another reasoning format a row of ``reasoning.REASONING_PARSERS``."""

from trinity.engine import (  # noqa: F401  (built-ins)
    external,
    tinker_engine,
    transformers_model,
    vllm_model,
)
from trinity.engine.registry import DEFAULT_ENGINE, ENGINES

__all__ = ["DEFAULT_ENGINE", "ENGINES"]
