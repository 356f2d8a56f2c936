"""The trainer: experiences in, weight updates out (native PyTorch; docs/concepts/index.md,
"Trainer").

``Trainer`` owns the model, optimizer, checkpoints and the training loop; ``policy_step``
turns one batch into gradients with the algorithm's components. A new algorithm is new
components in ``trinity.algorithm``, never a new trainer.
"""
