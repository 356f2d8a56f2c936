"""Compute shared by the rollout engine and the trainer, below both (docs/design-notes.md,
"Code layout").

- ``attention``: shared-prefix ("cascade") attention over a KV cache that keeps each
  distinct prompt once; the engine decodes with it, the trainer scores GRPO groups with it.

Extending: put code here only when both an engine and the trainer run it, and keep it to
``torch`` and ``transformers``: this layer imports nothing else of ``trinity``.
"""
