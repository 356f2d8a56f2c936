"""Low-precision copies of a model's ``nn.Linear`` weights, cast once and reused by every pass.

Under ``torch.autocast`` each forward casts every fp32 weight a matmul reads to bf16/fp16,
and autocast's cache of those casts lives only inside one autocast region (one model
call); a weight that does not require grad (a frozen reference model, LoRA's base) is not
cached at all. A train step of many micro-batches therefore casts the same unchanged
weights once per micro-batch and per call. ``ComputeWeights`` keeps one low-precision leaf
per fp32 master and swaps it into the module for a pass, still inside the autocast region:
autocast leaves an operand that is already in its dtype alone, and every other op keeps
autocast's own policy (softmax, norms, embeddings, losses in fp32), so the numbers are
autocast's.

- Only the weight and bias of plain ``nn.Linear`` modules are swapped: exactly the tensors
  autocast would cast to the compute dtype (``linear`` is on its lower-precision list).
  Norm weights, embeddings and anything else stay the fp32 masters, as autocast runs them.
- A copy is refreshed when its master changed, read from the master's version counter
  (``Tensor._version``: every in-place write bumps it: the optimizer step, ``load_state_dict``,
  a resume). So the policy's copies are made by the first pass after each
  optimizer step, and a frozen model's copies live until its weights are written.
- A trainable copy's gradient is handed to its master after each backward (a
  post-accumulate-grad hook): added to the master's ``.grad`` in fp32, the copy's own grad
  cleared, so micro-batches accumulate in fp32 as they do under plain autocast.
- One copy per master: a tied weight (the output head sharing the embedding) is one master,
  hence one copy, and its gradients from each use are summed on the master.
- Gradient checkpointing: the recomputation in backward runs after the pass has put the
  masters back, so it is plain autocast's (it casts the masters to the same values the
  copies hold, and their gradients reach the masters directly); the forward and the
  layers outside the checkpoints (the output head) still read the copies.

Nothing here when it does not apply (``applies``): fp32 compute (nothing to cast) and sharded
(DTensor) parameters, whose FSDP2 hooks gather and free the shards around each module, swap
their own storage and cast under their own policy. Those keep plain autocast.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Tuple

import torch

__all__ = ["ComputeWeights", "applies"]


def _sharded(param: torch.Tensor) -> bool:
    # A name check: importing torch.distributed.tensor is slow and needless on one process.
    return type(param).__name__ == "DTensor"


def applies(model: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``model`` can compute in ``dtype`` from cached copies (see the module doc)."""
    if dtype == torch.float32:
        return False
    return not any(_sharded(p) for p in model.parameters())


class ComputeWeights:
    """``dtype`` copies of ``model``'s ``nn.Linear`` weights; ``swapped()`` computes from them."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        # (module, name, master, copy) per swapped slot; one copy per distinct master
        self.slots: List[Tuple[torch.nn.Module, str, torch.nn.Parameter, torch.nn.Parameter]] = []
        copies: Dict[int, torch.nn.Parameter] = {}
        for module in model.modules():
            if type(module) is not torch.nn.Linear:  # subclasses may read weights elsewhere
                continue
            for name in ("weight", "bias"):
                master = module._parameters.get(name)
                if master is None or master.dtype != torch.float32:
                    continue
                if id(master) not in copies:
                    copies[id(master)] = self._copy_of(master)
                self.slots.append((module, name, master, copies[id(master)]))
        self.masters = {id(s[2]): (s[2], copies[id(s[2])]) for s in self.slots}
        # master id -> (its version, its storage) when last copied
        self.versions: Dict[int, Tuple[int, int]] = {}
        self.depth = 0  # swapped() nests: the decoder's pass inside the model's
        self.casts = 0  # copies made, for tests and benchmarks

    def _copy_of(self, master: torch.nn.Parameter) -> torch.nn.Parameter:
        copy = torch.nn.Parameter(
            torch.empty_like(master, dtype=self.dtype), requires_grad=master.requires_grad
        )
        if master.requires_grad:
            copy.register_post_accumulate_grad_hook(self._hand_back(master))
        return copy

    @staticmethod
    def _hand_back(master: torch.nn.Parameter) -> Callable[[torch.Tensor], None]:
        """The hook that moves a copy's gradient onto ``master`` in fp32 after a backward."""

        def hook(copy: torch.Tensor) -> None:
            grad = copy.grad
            copy.grad = None
            if grad is None:
                return
            if master.grad is None:
                master.grad = grad.to(master.dtype)
            else:
                master.grad.add_(grad)

        return hook

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy every master whose version moved since its last copy (none: nothing)."""
        for key, (master, copy) in self.masters.items():
            # ``.data`` replaced (``module.to``) leaves the version alone: the storage counts too
            state = (master._version, master.data_ptr())
            if self.versions.get(key) != state:
                if copy.device != master.device:
                    copy.data = torch.empty_like(master, dtype=self.dtype)
                copy.copy_(master)
                self.versions[key] = state
                self.casts += 1

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The modules hold the copies inside; the masters again on leaving. The autograd
        graph built inside keeps the copies, so the backward after leaving still reaches them
        (and through the hook, the masters)."""
        if self.depth:
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        self.refresh()
        for module, name, _, copy in self.slots:
            module._parameters[name] = copy
        self.depth = 1
        try:
            yield
        finally:
            self.depth = 0
            for module, name, master, _ in self.slots:
                module._parameters[name] = master
