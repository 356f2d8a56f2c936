"""The training calls: forward_backward (and forward), optim_step, save and load weights.

Each checks its request on the event loop (a 400 naming the field: the loss, its config
keys, every datum's inputs and their shapes, the token ids) and queues its work on the
worker through ``TinkerService.queue``, which keeps a model's requests in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from trinity.tinker import checkpoints as ckpt
from trinity.tinker import wire
from trinity.tinker.errors import TinkerError, bad_field
from trinity.tinker.lora_models import LORA_ALPHA, LoraSpec
from trinity.tinker.losses import LOSSES, LossSpec
from trinity.tinker.proto_codec import Datum, decode_forward_backward
from trinity.tinker.sampler import AdapterWeights
from trinity.tinker.service import TinkerService, check_optimizer
from trinity.tinker.sessions import TrainingModel

# Loss names the SDK lists that this server does not compute, and why.
UNSUPPORTED_LOSSES = {
    "gspo": "its sequence-level ratio and clip range are not documented precisely enough to "
    "match; use ppo, cispo or forward_backward_custom",
    "stable_reinforce": "it reads stability information a sampler records server-side, which "
    "this server does not record; use importance_sampling, ppo or cispo",
    "custom": "server-side custom losses; forward_backward_custom runs the loss client-side "
    "with this server (client config custom_loss_server_side: false)",
}


@dataclass
class ForwardBackwardResult:
    """Per datum its output arrays (``logprobs``), and the metrics (``loss:sum``)."""

    outputs: List[Dict[str, np.ndarray]]
    metrics: Dict[str, float]


def forward_backward(
    service: TinkerService, raw: bytes, content_type: str, encoding: str
) -> Dict[str, Any]:
    """``POST /api/v1/forward_backward``: a protobuf ``ForwardBackwardRequest``."""
    if "protobuf" not in content_type:
        raise bad_field(
            "Content-Type", f"'{content_type}': forward_backward takes application/x-protobuf"
        )
    request = decode_forward_backward(raw, encoding)
    model = service.registry.model(request.model_id)
    loss = loss_spec(request.loss_fn)
    config = loss_config(loss, request.config)
    check_data(request.data, loss, service.trainer.vocab_size, service.served.max_model_len)
    backward = not request.forward_only

    def run() -> ForwardBackwardResult:
        outputs, total = service.trainer.forward_backward(
            model.model_id, request.data, loss, config, backward
        )
        return ForwardBackwardResult([{"logprobs": lp} for lp in outputs], {"loss:sum": total})

    kind = "ForwardBackward" if backward else "Forward"
    return service.queue(model, request.seq_id, kind, run)


def loss_spec(name: str) -> LossSpec:
    if name in LOSSES:
        return LOSSES[name]
    if name in UNSUPPORTED_LOSSES:
        raise bad_field(
            "loss_fn", f"'{name}' is not supported by this server: {UNSUPPORTED_LOSSES[name]}"
        )
    raise bad_field("loss_fn", f"unknown loss '{name}'; this server computes {sorted(LOSSES)}")


def loss_config(loss: LossSpec, given: Dict[str, object]) -> Dict[str, float]:
    """The loss's settings: ``given`` over the defaults; unknown or missing keys refused."""
    config: Dict[str, float] = {}
    for key, value in given.items():
        field = f"loss_fn_config.{key}"
        if key not in loss.config:
            known = sorted(loss.config) or "none"
            raise bad_field(field, f"not a setting of {loss.name} (its settings: {known})")
        if not isinstance(value, float) or not np.isfinite(value):
            raise bad_field(field, f"{value!r} is not a finite number")
        config[key] = value
    for key, default in loss.config.items():
        if key not in config:
            if default is None:
                raise bad_field(f"loss_fn_config.{key}", f"required by {loss.name} (no default)")
            config[key] = default
    return config


def check_data(data: List[Datum], loss: LossSpec, vocab: int, max_len: int) -> None:
    """Every datum's tokens and ``loss_fn_inputs`` as ``loss`` needs them."""
    if not data:
        raise bad_field("data", "no datum")
    allowed = {"target_tokens", *loss.required, *loss.optional}
    for i, datum in enumerate(data):
        field = f"data[{i}]"
        n = len(datum.tokens)
        if not 0 < n <= max_len:
            raise bad_field(f"{field}.model_input", f"{n} tokens; 1 to {max_len} are accepted")
        _check_ids(np.asarray(datum.tokens), vocab, f"{field}.model_input")
        for name in datum.inputs:
            if name not in allowed:
                raise bad_field(
                    f"{field}.loss_fn_inputs.{name}",
                    f"not an input of {loss.name} (its inputs: {sorted(allowed)})",
                )
        targets = _targets(datum, loss, n, vocab, f"{field}.loss_fn_inputs.target_tokens")
        for name in loss.required:
            if name not in datum.inputs:
                raise bad_field(f"{field}.loss_fn_inputs.{name}", f"required by {loss.name}")
        for name, value in datum.inputs.items():
            where = f"{field}.loss_fn_inputs.{name}"
            if name != "target_tokens" and value.shape != targets.shape:
                raise bad_field(
                    where,
                    f"shape {list(value.shape)}, not that of target_tokens {list(targets.shape)}",
                )
            if name != "target_tokens" and not np.isfinite(value).all():
                raise bad_field(where, "holds NaN or infinity")


def _targets(datum: Datum, loss: LossSpec, n: int, vocab: int, field: str) -> np.ndarray:
    targets = datum.inputs.get("target_tokens")
    if targets is None:
        raise bad_field(field, "required")
    if targets.dtype.kind not in "iu":
        raise bad_field(field, f"{targets.dtype} values; token ids are integers (int64)")
    ndim = 2 if loss.candidates else 1
    if targets.ndim not in (1, ndim) or targets.shape[0] != n:
        shapes = "(N,) or (N, K)" if loss.candidates else "(N,)"
        raise bad_field(
            field,
            f"shape {list(targets.shape)}; {loss.name} takes {shapes} with N = {n}, the "
            "input's length",
        )
    _check_ids(targets, vocab, field)
    return targets


def _check_ids(ids: np.ndarray, vocab: int, field: str) -> None:
    bad = ids[(ids < 0) | (ids >= vocab)]
    if bad.size:
        raise bad_field(field, f"token ids outside [0, {vocab}): {bad[:5].tolist()}")


def optim_step(service: TinkerService, body: wire.OptimStep) -> Dict[str, Any]:
    """``POST /api/v1/optim_step``: one AdamW step with the hyperparameters sent."""
    model = service.registry.model(body.model_id)
    if body.optimizer_params is not None:
        kind = body.optimizer_params.get("type")
        check_optimizer(kind, "optimizer_params.type")
    hyper = body.adam_params or body.optim_params
    if hyper is None:
        raise bad_field("adam_params", "required")
    check_optimizer(hyper.type, "adam_params.type")

    def run() -> Dict[str, Any]:
        return {"metrics": service.trainer.optim_step(model.model_id, hyper)}

    return service.queue(model, body.seq_id, "OptimStep", run)


def _meta(service: TinkerService, model: TrainingModel, body: Any, steps: Any) -> Dict[str, Any]:
    return {
        "model_id": model.model_id,
        "base_model": service.served.name,
        "lora": model.spec.to_json(),
        "optimizer_steps": steps,
        "user_metadata": body.user_metadata,
    }


def save_weights(service: TinkerService, body: wire.SaveWeights) -> Dict[str, Any]:
    """``POST /api/v1/save_weights`` (``save_state``): adapter and optimizer state."""
    model = service.registry.model(body.model_id)
    path = _new_path(service, model, "weights", body.path, body.overwrite)

    def run() -> Dict[str, Any]:
        trainer = service.trainer
        moments, steps = trainer.optimizer_state(model.model_id)
        adapter, peft = trainer.adapter_state(model.model_id), trainer.peft_config(model.model_id)
        service.store.save(path, adapter, peft, _meta(service, model, body, steps), moments)
        return {"type": "save_weights", "path": str(path)}

    return service.queue(model, body.seq_id, "SaveWeights", run)


def _new_path(
    service: TinkerService, model: TrainingModel, kind: str, name: Any, overwrite: bool
) -> ckpt.CheckpointPath:
    if not name:
        raise bad_field("path", "required: the checkpoint's name")
    path = ckpt.CheckpointPath(model.model_id, kind, ckpt.check_name(name, "path"))
    if service.store.exists(path) and not overwrite:
        raise bad_field("path", f"{path} exists; save under another name (or overwrite it)")
    return path


def save_weights_for_sampler(service: TinkerService, body: wire.SaveWeights) -> Dict[str, Any]:
    """``POST /api/v1/save_weights_for_sampler``: named, a sampler checkpoint; unnamed, a
    sampling session over the current weights (``kind`` "snapshot" or "inflight": both are
    snapshots here, which the inflight contract allows: a sampler may keep older weights)."""
    model = service.registry.model(body.model_id)
    if body.kind not in ("snapshot", "inflight"):
        raise bad_field("kind", f"'{body.kind}' is not snapshot or inflight")
    if body.path:
        path = _new_path(service, model, "sampler_weights", body.path, False)

        def run() -> Dict[str, Any]:
            trainer = service.trainer
            adapter, peft = (
                trainer.adapter_state(model.model_id),
                trainer.peft_config(model.model_id),
            )
            service.store.save(path, adapter, peft, _meta(service, model, body, None))
            return {"type": "save_weights_for_sampler", "path": str(path)}

        return service.queue(model, body.seq_id, "SaveWeightsForSampler", run)
    record = service.ephemeral_sampler(model, body.sampling_session_seq_id)

    def snapshot() -> Dict[str, Any]:
        state = service.trainer.adapter_state(model.model_id)
        record.weights = AdapterWeights.from_state(state, LORA_ALPHA, model.spec.rank)
        return {"type": "save_weights_for_sampler", "sampling_session_id": record.sampler_id}

    return service.queue(model, body.seq_id, "SaveWeightsForSampler", snapshot)


def load_weights(service: TinkerService, body: wire.LoadWeights) -> Dict[str, Any]:
    """``POST /api/v1/load_weights``: onto a model (``model_id``), or as a new model of a
    session (``session_id`` and ``model_seq_id``: create_training_client_from_state)."""
    path = ckpt.parse(body.path, "path")
    meta = service.store.meta(path, "path")
    service.check_base(meta, "path")
    if body.optimizer and path.kind != "weights":
        raise bad_field("optimizer", f"{path} is a sampler checkpoint: it holds no optimizer state")
    spec = LoraSpec(**meta["lora"])
    if body.model_id is not None:
        model = service.registry.model(body.model_id)
        if (spec.rank, spec.train_mlp, spec.train_attn, spec.train_unembed) != (
            model.spec.rank,
            model.spec.train_mlp,
            model.spec.train_attn,
            model.spec.train_unembed,
        ):
            raise bad_field(
                "path",
                f"{path} is an adapter of another shape ({meta['lora']}) than this model's "
                f"({model.spec.to_json()})",
            )
        run = lambda: _load(service, model, path, body.optimizer, meta)  # noqa: E731
        return service.queue(model, body.seq_id, "LoadWeights", run)
    if body.session_id is None or body.model_seq_id is None:
        raise bad_field("model_id", "required (or session_id and model_seq_id for a new model)")
    session = service.registry.session(body.session_id)
    service.served.check(body.base_model, "base_model")
    model = service.register(session, body.model_seq_id, spec, body.user_metadata)

    def create_and_load() -> Dict[str, Any]:
        service.trainer.add(model.model_id, spec)
        return _load(service, model, path, body.optimizer, meta)

    return service.queue(model, None, "LoadWeights", create_and_load)


def _load(
    service: TinkerService,
    model: TrainingModel,
    path: ckpt.CheckpointPath,
    optimizer: bool,
    meta: Dict[str, Any],
) -> Dict[str, Any]:
    state, _ = service.store.load(path, "path")
    service.trainer.load_adapter_state(model.model_id, state, str(path))
    if optimizer:
        moments = service.store.load_optimizer(path, "path")
        service.trainer.load_optimizer_state(
            model.model_id, moments, meta.get("optimizer_steps") or {}
        )
    return {"type": "load_weights", "path": str(path), "model_id": model.model_id}


__all__ = ["ForwardBackwardResult", "TinkerError"]
