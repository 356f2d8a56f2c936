"""Compute shared by the rollout engine and the trainer, below both (docs/design-notes.md,
"Code layout").

- ``attention``: shared-prefix ("cascade") attention over a KV cache that keeps each
  distinct prompt once; the engine decodes with it, the trainer scores GRPO groups with it.
- ``decode_attention``: the engine's one-token step of that attention, one softmax over the
  prompt's and the row's own scores (the cascade merges two for several tokens per row).
- ``llama_forward``: the engine's forward for Llama-shaped models on CPU (fused q/k/v and
  gate/up matmuls, no transformers modules). Only the engine runs it, but it is here
  because the shared-prefix decoder, which both use, calls it.
- ``packed_linear``: linear layers through oneDNN on CPU: the engine's with their weights
  packed once per weight version, the trainer's fp32 ones differentiable (``route_linears``).

Extending: put code here only when both an engine and the trainer run it (or code here
that both run calls it), and keep it to ``torch`` and ``transformers``: this layer imports
nothing else of ``trinity``.
"""
