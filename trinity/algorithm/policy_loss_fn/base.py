"""The ``PolicyLossFn`` interface and its registry."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch

from trinity.algorithm.utils import check_loss_agg_mode
from trinity.common.registry import Registry

POLICY_LOSS_FN: Registry = Registry("policy_loss_fn", base=lambda: PolicyLossFn)


def call_parameter_names(fn) -> Tuple[str, ...]:
    """Names of ``fn``'s named parameters, without ``self``, ``*args`` and ``**kwargs``."""
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind not in skip and p.name != "self")


class PolicyLossFn(ABC):
    """The policy's training loss from per-token tensors.

    The trainer reads ``select_keys`` (the parameter names of ``__call__``) and passes
    exactly those tensors, each ``(B, R)``: ``logprob`` is the current policy's logprob
    of the response tokens, every other name is looked up in the batch with
    ``ExperienceBatch.tensor(name)`` (``old_logprob``, ``action_mask``, ``advantages``,
    ``ref_logprob``, ...). So a subclass lists the tensors it needs as parameters and
    keeps ``**kwargs`` for forward compatibility.

    A loss that needs a statistic of the whole batch (not of one micro-batch) overrides
    ``batch_inputs``; its parameter names become ``batch_keys``.

    Constructor arguments come from ``algorithm.policy_loss_fn_args``.
    """

    # Class-level fallbacks, so subclasses that do not call ``super().__init__`` (like the
    # developer guide's OPMD example) still answer these.
    loss_agg_mode: str = "token-mean"
    select_keys: Tuple[str, ...] = ()
    batch_keys: Tuple[str, ...] = ()
    # Arguments the original's loss of this name took and this one accepts without reading
    # (name -> why): the config check lets them through, validate.warn_inert lists them, and
    # ``build_policy_loss`` keeps them from the constructor.
    inert_args: Dict[str, str] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.select_keys = call_parameter_names(cls.__call__)
        if cls.batch_inputs is not PolicyLossFn.batch_inputs:
            cls.batch_keys = call_parameter_names(cls.batch_inputs)

    def __init__(self, loss_agg_mode: str = "token-mean") -> None:
        self.loss_agg_mode = check_loss_agg_mode(loss_agg_mode)

    @abstractmethod
    def __call__(
        self, logprob: torch.Tensor, action_mask: torch.Tensor, **kwargs
    ) -> Tuple[torch.Tensor, Dict]:
        """Return the scalar loss and its metrics (bare names; the trainer adds ``actor/``)."""

    def batch_inputs(self, **tensors: torch.Tensor) -> Dict[str, torch.Tensor]:
        """``(B, R)`` tensors computed over the whole batch, added to it by name for
        ``__call__`` to read (e.g. M2PO's token mask, which ranks every token of the batch).

        The trainer calls an override once per optimisation pass, before the micro-batches,
        with the parameters it names looked up as ``__call__``'s are: ``logprob`` is the whole
        batch's under the current weights (an extra no-grad pass). Not overridden: no call,
        no extra pass.
        """
        return {}

    @classmethod
    def default_args(cls) -> Dict:
        """Default constructor arguments, used where the config leaves them unset."""
        return {}


def build_policy_loss(name: str, args: Dict) -> PolicyLossFn:
    """The policy loss registered as ``name``, built from ``args`` less its ``inert_args``."""
    cls = POLICY_LOSS_FN.get(name)
    inert = getattr(cls, "inert_args", {})  # a plugin loss need not subclass PolicyLossFn
    return cls(**{key: value for key, value in args.items() if key not in inert})
