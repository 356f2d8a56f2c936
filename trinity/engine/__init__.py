"""Rollout engines and what sits in front of them (DESIGN.md §6: ``engine/``).

- ``conversation``: token-exact multi-turn prompts (each turn continues the previous turn's
  sampled tokens), used wherever conversations reach an engine.
- ``server``: the OpenAI-compatible HTTP API over any engine (``build_app`` over a
  ``ServedModel``; ``RunningServer`` serves it on the running event loop), with
  ``openai_protocol`` (request bodies -> ``SamplingParams``, replies, errors) and
  ``tool_calls`` (tool calls written in a reply's text -> OpenAI ``tool_calls``).
- ``client``: ``openai`` clients for a server that record each reply's exact tokens
  (``ModelWrapper.get_openai_client`` with ``enable_history``).
- ``external``: an OpenAI-compatible API in place of an engine (``engine_type: external``),
  as an auxiliary model's clients or as the rollout model of an explore-only run.
- ``standalone``: one local model served over the API in a process of its own.

Extending: a new engine implements ``trinity.common.models.model.InferenceModel``
(``chat``, ``generate``, ``generate_ids``, ``load_weights``, ``model_version``). To serve it,
build a ``ServedModel`` (its ``generate_ids``, tokenizer functions and ``max_model_len``; see
``ServedModel.from_transformers``) and have its host answer ``api_address()`` with the
server's ``{"url", "model"}``, as ``EngineActor`` does. Another tool-call format is another
parser with ``parse_tool_calls``' contract.
"""
