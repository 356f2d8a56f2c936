"""Training models: LoRA adapters over one shared base model, each with its own AdamW.

The base model is loaded once; every training model of the service is a named ``peft``
adapter on it (``LoraTrainer.add``), switched in before its work runs, so several training
clients of one base model share its memory. Only the worker thread calls these methods.

The LoRA parametrisation is peft's: ``W + (alpha / rank) * B @ A``, B zero at creation (a
new model computes what the base model computes), A drawn from ``seed``, and ``alpha`` fixed
at ``LORA_ALPHA`` for every rank. ``train_attn``/``train_mlp``/``train_unembed`` choose the
linear layers adapted: those under an attention block, those under an MLP block, and the
output head.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from trinity.tinker.errors import TinkerError, bad_field
from trinity.tinker.losses import LossSpec
from trinity.tinker.proto_codec import Datum

logger = logging.getLogger(__name__)

# LoRA's alpha for every rank (so the update's scale is LORA_ALPHA / rank), the value of
# Thinking Machines' "LoRA Without Regret", which Tinker's hyperparameter advice assumes.
LORA_ALPHA = 32

# Logits elements (tokens x vocabulary) one micro-batch may hold: the logprobs of a
# forward_backward are computed this many at a time (128 MB of fp32 logits), each
# micro-batch's backward run before the next forward.
MICRO_BATCH_ELEMENTS = 2**25

_ATTN = ("attn", "attention")
_MLP = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class LoraSpec:
    """What a create_model asks for (the SDK's ``LoraConfig``)."""

    rank: int
    seed: Optional[int] = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Adapter:
    name: str  # the peft adapter's name
    spec: LoraSpec
    optimizer: torch.optim.AdamW
    params: Dict[str, torch.nn.Parameter]  # by their saved names (adapter name left out)


def module_groups(model: torch.nn.Module) -> Dict[str, List[str]]:
    """The full names of the linear layers each switch adapts, by switch name."""
    head = model.get_output_embeddings()
    found: Dict[str, List[str]] = {"train_attn": [], "train_mlp": [], "train_unembed": []}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parts = name.lower().split(".")
        if module is head:
            found["train_unembed"].append(name)
        elif any(key in part for part in parts for key in _ATTN):
            found["train_attn"].append(name)
        elif any(key in part for part in parts for key in _MLP):
            found["train_mlp"].append(name)
    return found


def target_modules(groups: Dict[str, List[str]], spec: LoraSpec) -> List[str]:
    """The layers ``spec`` adapts; a 400 naming the switch that is on but finds none in this
    architecture, or when every switch is off."""
    names: List[str] = []
    for switch, modules in groups.items():
        if getattr(spec, switch):
            if not modules:
                raise bad_field(f"lora_config.{switch}", "this model has no such linear layers")
            names.extend(modules)
    if not names:
        raise bad_field("lora_config", "train_attn, train_mlp or train_unembed must be true")
    return names


class LoraTrainer:
    """The base model and its adapters, by model id."""

    def __init__(self, base_path: str, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
        model.to(self.device).eval()  # eval: no dropout anywhere, train or score
        model.requires_grad_(False)
        self.model: Any = model
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.arch = (model.config.architectures or [type(model).__name__])[0]
        self.groups = module_groups(model)  # read once: the worker changes the module tree
        self.adapters: Dict[str, Adapter] = {}
        self._names = itertools.count()

    # ---------------------------------------------------------------- adapters

    def add(self, model_id: str, spec: LoraSpec) -> None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=spec.rank,
            lora_alpha=LORA_ALPHA,
            target_modules=target_modules(self.groups, spec),
            lora_dropout=0.0,
            bias="none",
        )
        name = f"m{next(self._names)}"
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft warns that a tied output head is adapted: only the head gets the update
            warnings.simplefilter("ignore", UserWarning)
            if spec.seed is not None:
                torch.manual_seed(spec.seed)
            if hasattr(self.model, "peft_config"):
                self.model.add_adapter(name, config)
            else:
                self.model = get_peft_model(self.model, config, adapter_name=name)
        params = self._params(name)
        optimizer = torch.optim.AdamW(list(params.values()), lr=0.0)
        self.adapters[model_id] = Adapter(name, spec, optimizer, params)
        trainable = sum(p.numel() for p in params.values())
        logger.info("model %s: LoRA rank %d, %d parameters train", model_id, spec.rank, trainable)

    def remove(self, model_id: str) -> None:
        adapter = self.adapters.pop(model_id, None)
        if adapter is not None:
            self.model.delete_adapter(adapter.name)

    def _params(self, name: str) -> Dict[str, torch.nn.Parameter]:
        tag = f".{name}."
        return {
            key.replace(tag, "."): param
            for key, param in self.model.named_parameters()
            if tag in key
        }

    def _use(self, model_id: str) -> Adapter:
        adapter = self.adapters[model_id]
        self.model.set_adapter(adapter.name)
        return adapter

    # ------------------------------------------------------------- training

    def forward_backward(
        self,
        model_id: str,
        data: List[Datum],
        loss: LossSpec,
        config: Dict[str, float],
        backward: bool,
    ) -> Tuple[List[np.ndarray], float]:
        """Each datum's target logprobs, and the loss summed over the data; with ``backward``
        its gradient is added to the adapter's (until ``optim_step``)."""
        self._use(model_id)
        outputs: List[np.ndarray] = []
        total = 0.0
        for batch in self._micro_batches(data):
            with torch.set_grad_enabled(backward):
                logprobs = self._logprobs(batch)
                losses = [
                    loss.fn(lp, self._inputs(d, loss), config)
                    for lp, d in zip(logprobs, batch, strict=True)
                ]
                batch_loss = torch.stack(losses).sum()
            if backward:
                batch_loss.backward()
            total += float(batch_loss.detach())
            outputs.extend(lp.detach().float().cpu().numpy() for lp in logprobs)
        return outputs, total

    def _micro_batches(self, data: List[Datum]) -> List[List[Datum]]:
        batches: List[List[Datum]] = [[]]
        longest = 0
        for datum in data:
            longest_then = max(longest, len(datum.tokens))
            if batches[-1] and (len(batches[-1]) + 1) * longest_then * self.vocab_size > (
                MICRO_BATCH_ELEMENTS
            ):
                batches.append([])
                longest_then = len(datum.tokens)
            batches[-1].append(datum)
            longest = longest_then
        return batches

    def _logprobs(self, batch: List[Datum]) -> List[torch.Tensor]:
        """Per datum, the logprobs of its ``target_tokens`` ((N,) or (N, K))."""
        width = max(len(d.tokens) for d in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, datum in enumerate(batch):  # right padding: positions count from 0 as usual
            ids[i, : len(datum.tokens)] = torch.tensor(datum.tokens)
            mask[i, : len(datum.tokens)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        out = []
        for i, datum in enumerate(batch):
            targets = torch.as_tensor(datum.inputs["target_tokens"], device=self.device)
            scores = logits.logits[i, : len(datum.tokens)].float().log_softmax(-1)
            picked = scores.gather(-1, targets.reshape(len(datum.tokens), -1).long())
            out.append(picked.reshape(targets.shape))
        return out

    def _inputs(self, datum: Datum, loss: LossSpec) -> Dict[str, torch.Tensor]:
        names = set(loss.required) | set(loss.optional)
        return {
            name: torch.as_tensor(value, dtype=torch.float32, device=self.device)
            for name, value in datum.inputs.items()
            if name in names
        }

    def optim_step(self, model_id: str, hyper: Any) -> Dict[str, float]:
        """One AdamW step of the adapter with ``hyper`` (the SDK's ``AdamParams``), then its
        gradients are cleared. ``grad_clip_norm`` > 0 clips the global norm first."""
        adapter = self.adapters[model_id]
        params = list(adapter.params.values())
        grads = [p.grad for p in params if p.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            if grads
            else 0.0
        )
        if hyper.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, hyper.grad_clip_norm)
        for group in adapter.optimizer.param_groups:
            group.update(
                lr=hyper.learning_rate,
                betas=(hyper.beta1, hyper.beta2),
                eps=hyper.eps,
                weight_decay=hyper.weight_decay,
            )
        adapter.optimizer.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "learning_rate": hyper.learning_rate}

    # ----------------------------------------------------------------- state

    def adapter_state(self, model_id: str) -> Dict[str, torch.Tensor]:
        """The adapter's tensors under peft's saved names (a copy)."""
        return {k: p.detach().clone().cpu() for k, p in self.adapters[model_id].params.items()}

    def load_adapter_state(self, model_id: str, state: Dict[str, torch.Tensor], source: str):
        params = self.adapters[model_id].params
        if set(state) != set(params):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise TinkerError(
                400,
                f"path: {source} is not an adapter of this model's shape (missing {missing[:2]}, "
                f"unexpected {extra[:2]})",
                "path",
            )
        with torch.no_grad():
            for key, param in params.items():
                param.copy_(state[key])

    def peft_config(self, model_id: str) -> Any:
        return self.model.peft_config[self.adapters[model_id].name]

    def optimizer_state(self, model_id: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, int]]:
        """AdamW's moments by parameter name (``<name>.exp_avg``, ``<name>.exp_avg_sq``) and
        each parameter's step count."""
        adapter = self.adapters[model_id]
        tensors, steps = {}, {}
        for key, param in adapter.params.items():
            state = adapter.optimizer.state.get(param)
            if state:
                tensors[f"{key}.exp_avg"] = state["exp_avg"].detach().cpu()
                tensors[f"{key}.exp_avg_sq"] = state["exp_avg_sq"].detach().cpu()
                steps[key] = int(state["step"])
        return tensors, steps

    def load_optimizer_state(
        self, model_id: str, tensors: Dict[str, torch.Tensor], steps: Dict[str, int]
    ) -> None:
        adapter = self.adapters[model_id]
        adapter.optimizer.state.clear()
        for key, param in adapter.params.items():
            if key in steps:
                adapter.optimizer.state[param] = {
                    "step": torch.tensor(float(steps[key])),
                    "exp_avg": tensors[f"{key}.exp_avg"].to(param),
                    "exp_avg_sq": tensors[f"{key}.exp_avg_sq"].to(param),
                }
