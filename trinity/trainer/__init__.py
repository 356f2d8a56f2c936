"""The trainer: experiences in, weight updates out (native PyTorch; docs/concepts/index.md,
"Trainer").

``Trainer`` owns the model, optimizer, checkpoints and the training loop; ``policy_step``
turns one batch into gradients with the algorithm's components, scoring tokens through
``token_scores`` (the output head applied a chunk of tokens at a time where the logits are
plainly ``lm_head(hidden)``; ``policy_step.PLAIN_HEAD_MODELS`` lists the architectures
shown to be, each tested against its full logits: add one there with such a test). A new
algorithm is new components in ``trinity.algorithm``, never a new trainer.
"""
