"""Rollout engines and what sits in front of them (DESIGN.md §6: ``engine/``).

- ``conversation``: token-exact multi-turn prompts (each turn continues the previous turn's
  sampled tokens), used wherever conversations reach an engine.

Extending: a new engine implements ``trinity.common.models.model.InferenceModel``
(``chat``, ``generate``, ``generate_ids``, ``load_weights``, ``model_version``).
"""
