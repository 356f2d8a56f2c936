"""The Tinker service: what each SDK call does, over the trainer, the sampler and futures.

``TinkerService`` is called by the routes (``routes.py``) on the event loop. Calls that do
model work check their request at once (a 4xx naming the field), register what they create,
queue the work on the worker thread (``worker.py``) and return a future id; the others
answer directly. The model work itself is in ``LoraTrainer`` (training) and ``Sampler``.

A training model's requests run in the order they arrive, which is the order of their
``seq_id``: the SDK sends each request only after the one before it was accepted (the
chunks of one ``forward_backward`` aside, whose order does not matter). A request resent
with a ``seq_id`` already seen (after a lost reply) gets the first one's future.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional

from trinity.tinker import checkpoints as ckpt
from trinity.tinker import wire
from trinity.tinker.errors import TinkerError, bad_field, not_found
from trinity.tinker.futures import Future, FutureStore
from trinity.tinker.lora_models import LORA_ALPHA, LoraSpec, LoraTrainer, target_modules
from trinity.tinker.sampler import AdapterWeights, Sampler
from trinity.tinker.sessions import Registry, SamplerRecord, Session, TrainingModel
from trinity.tinker.worker import Worker

# Samplers made by unnamed save_weights_for_sampler calls keep their weights in memory; a
# training model keeps its latest this many (RL makes one per step), older ones expire.
EPHEMERAL_SAMPLERS = 8


@dataclass(frozen=True)
class Served:
    """The base model this server trains and samples."""

    name: str  # what clients call it (the --model-name, else --base-model as given)
    path: str  # its local folder
    aliases: tuple  # other names accepted for it
    max_model_len: int
    tokenizer_id: str  # what the SDK's get_tokenizer loads: the hub id, else the folder

    def check(self, requested: Optional[str], field: str) -> None:
        if requested is not None and requested != self.name and requested not in self.aliases:
            raise TinkerError(
                404,
                f"{field}: this server holds no base model '{requested}'; it serves "
                f"'{self.name}' (see get_server_capabilities)",
                field,
            )


class TinkerService:
    """Sessions, training models, checkpoints and samplers of one base model."""

    def __init__(
        self,
        served: Served,
        trainer: LoraTrainer,
        sampler: Sampler,
        store: ckpt.CheckpointStore,
        futures: FutureStore,
        max_samples: int,
    ) -> None:
        self.served, self.trainer, self.sampler, self.store = served, trainer, sampler, store
        self.futures, self.max_samples = futures, max_samples
        self.registry = Registry()
        self.worker = Worker(futures, sampler.run_batch)
        self._ephemeral: Dict[str, Deque[str]] = collections.defaultdict(collections.deque)
        self._loaded: Dict[str, AdapterWeights] = {}  # tinker path -> weights, latest few

    def close(self) -> None:
        self.worker.close()

    # ------------------------------------------------------------------ sessions

    def capabilities(self) -> Dict[str, Any]:
        model = {
            "model_name": self.served.name,
            "max_context_length": self.served.max_model_len,
            "trainable": True,
            "sampleable": True,
        }
        return {"supported_models": [model]}

    def create_session(self, body: wire.CreateSession) -> Dict[str, Any]:
        self._reap()
        session = self.registry.open(body.user_metadata, body.display_name)
        return {"type": "create_session", "session_id": session.session_id}

    def heartbeat(self, body: wire.SessionRef) -> Dict[str, Any]:
        self.registry.session(body.session_id).heartbeat = _now()
        self._reap()
        return {"type": "session_heartbeat"}

    def finish_session(self, session_id: str) -> None:
        session = self.registry.sessions.get(session_id)
        if session is None:
            raise not_found("session_id", session_id, "session")
        if not session.finished:
            self._unload(self.registry.close(session))

    def get_session(self, session_id: str) -> Dict[str, Any]:
        session = self.registry.sessions.get(session_id)
        if session is None:
            raise not_found("session_id", session_id, "session")
        return {
            "training_run_ids": list(session.models),
            "sampler_ids": list(session.samplers),
            "user_metadata": session.user_metadata,
            "display_name": session.display_name,
        }

    def _reap(self) -> None:
        for session in self.registry.stale():
            self._unload(self.registry.close(session))

    def _unload(self, model_ids: List[str]) -> None:
        for model_id in model_ids:
            self._ephemeral.pop(model_id, None)
            self.worker.submit(None, lambda m=model_id: self.trainer.remove(m))

    # ------------------------------------------------------------------ models

    def create_model(self, body: wire.CreateModel) -> Dict[str, Any]:
        session = self.registry.session(body.session_id)
        self.served.check(body.base_model, "base_model")
        if body.lora_config is None:
            raise bad_field("lora_config", "required: this server trains LoRA adapters only")
        check_optimizer(body.optimizer_config.type, "optimizer_config.type")
        spec = LoraSpec(**body.lora_config.model_dump())
        target_modules(self.trainer.groups, spec)
        model = self.register(session, body.model_seq_id, spec, body.user_metadata)
        future = self.futures.create("CreateModel")
        self.worker.submit(future, lambda: self._add(model.model_id, spec))
        return _future(future, model.model_id)

    def register(self, session: Session, seq: int, spec: LoraSpec, meta: Any) -> TrainingModel:
        """A new training model of ``session`` (its id the one the SDK derives too)."""
        model_id = f"{session.session_id}:train:{seq}"
        if model_id in self.registry.models:
            raise bad_field("model_seq_id", f"{seq} already names a model of this session")
        model = TrainingModel(model_id, session.session_id, self.served.name, spec, meta)
        self.registry.models[model_id] = model
        session.models.append(model_id)
        return model

    def _add(self, model_id: str, spec: LoraSpec) -> Dict[str, Any]:
        self.trainer.add(model_id, spec)
        return {"type": "create_model", "model_id": model_id}

    def get_info(self, body: wire.ModelRef) -> Dict[str, Any]:
        model = self.registry.model(body.model_id)
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": {
                "arch": self.trainer.arch,
                "model_name": self.served.name,
                "tokenizer_id": self.served.tokenizer_id,
            },
            "is_lora": True,
            "lora_rank": model.spec.rank,
            "model_name": self.served.name,
        }

    def unload_model(self, body: wire.ModelRef) -> Dict[str, Any]:
        model = self.registry.model(body.model_id)
        del self.registry.models[model.model_id]
        session = self.registry.sessions[model.session_id]
        session.models.remove(model.model_id)
        self._ephemeral.pop(model.model_id, None)
        future = self.futures.create("UnloadModel")
        self.worker.submit(future, lambda: self._remove(model.model_id))
        return _future(future, model.model_id)

    def _remove(self, model_id: str) -> Dict[str, Any]:
        self.trainer.remove(model_id)
        return {"type": "unload_model", "model_id": model_id}

    def queue(
        self, model: TrainingModel, seq_id: Optional[int], kind: str, run: Callable[[], Any]
    ) -> Dict[str, Any]:
        """Queue one of ``model``'s requests; a resend of a ``seq_id`` gets its first future."""
        if seq_id is not None and seq_id in model.seen:
            return {"request_id": model.seen[seq_id], "model_id": model.model_id}
        future = self.futures.create(kind)
        if seq_id is not None:
            model.seen[seq_id] = future.request_id
        self.worker.submit(future, run)
        return _future(future, model.model_id)

    def training_run(self, run_id: str) -> Dict[str, Any]:
        model = self.registry.models.get(run_id)
        found = self.store.listing(run_id)
        if model is None and not found:
            raise not_found("training_run_id", run_id, "training run")
        training = [c for c in found if c["checkpoint_type"] == "training"]
        sampler = [c for c in found if c["checkpoint_type"] == "sampler"]
        return {
            "training_run_id": run_id,
            "base_model": self.served.name,
            "model_owner": "trinity",
            "is_lora": True,
            "lora_rank": model.spec.rank if model else None,
            "last_request_time": ckpt.iso_time(model.last_request) if model else found[-1]["time"],
            "last_checkpoint": training[-1] if training else None,
            "last_sampler_checkpoint": sampler[-1] if sampler else None,
            "user_metadata": model.user_metadata if model else None,
        }

    # ----------------------------------------------------------------- samplers

    def create_sampling_session(self, body: wire.CreateSamplingSession) -> Dict[str, Any]:
        session = self.registry.session(body.session_id)
        record = self._sampler(
            session, body.sampling_session_seq_id, body.base_model, body.model_path
        )
        return {"type": "create_sampling_session", "sampling_session_id": record.sampler_id}

    def _sampler(
        self, session: Session, seq: int, base_model: Optional[str], model_path: Optional[str]
    ) -> SamplerRecord:
        sampler_id = f"{session.session_id}:sample:{seq}"
        if sampler_id in self.registry.samplers:
            raise bad_field("sampling_session_seq_id", f"{seq} already names a sampler")
        if model_path is None and base_model is None:
            raise bad_field("model_path", "model_path or base_model is required")
        self.served.check(base_model, "base_model")
        weights = self.weights_at(model_path, "model_path") if model_path else None
        record = SamplerRecord(
            sampler_id, session.session_id, self.served.name, model_path, weights
        )
        return self.registry.add_sampler(session, record)

    def weights_at(self, path: str, field: str) -> AdapterWeights:
        """The adapter at a tinker path, read once while it stays among the latest few."""
        if path not in self._loaded:
            where = ckpt.parse(path, field)
            self.check_base(self.store.meta(where, field), field)
            state, meta = self.store.load(where, field)
            peft = meta["peft"]
            self._loaded[path] = AdapterWeights.from_state(state, peft["lora_alpha"], peft["r"])
            while len(self._loaded) > EPHEMERAL_SAMPLERS:
                self._loaded.pop(next(iter(self._loaded)))
        return self._loaded[path]

    def check_base(self, meta: Dict[str, Any], field: str) -> None:
        """A checkpoint of another base model (a state dir shared across servers) is refused."""
        if meta.get("base_model") not in (self.served.name, *self.served.aliases):
            raise bad_field(
                field,
                f"{meta.get('tinker_path')} was trained on '{meta.get('base_model')}'; this "
                f"server serves '{self.served.name}'",
            )

    def ephemeral_sampler(self, model: TrainingModel, seq: Optional[int]) -> SamplerRecord:
        """The sampling session an unnamed save_weights_for_sampler opens."""
        session = self.registry.session(model.session_id)
        if seq is None:
            seq = 1_000_000 + model.samplers  # older SDKs send none: any unused number
        model.samplers += 1
        record = self._sampler(session, seq, self.served.name, None)
        recent = self._ephemeral[model.model_id]
        recent.append(record.sampler_id)
        while len(recent) > EPHEMERAL_SAMPLERS:
            old = self.registry.samplers.get(recent.popleft())
            if old is not None:
                old.expired = True
                old.weights = None
        return record

    def join_sampling_session(self, body: wire.SamplingSessionRef) -> Dict[str, Any]:
        record = self.registry.sampler(body.sampling_session_id)
        record.clients += 1
        return {"type": "join_sampling_session", "client_counter": record.clients}

    def get_sampler(self, sampler_id: str) -> Dict[str, Any]:
        record = self.registry.sampler(sampler_id, "sampler_id")
        return {
            "sampler_id": record.sampler_id,
            "base_model": record.base_model,
            "model_path": record.model_path,
        }

    def weights_info(self, body: wire.WeightsInfo) -> Dict[str, Any]:
        meta = self.store.meta(ckpt.parse(body.tinker_path, "tinker_path"), "tinker_path")
        lora = meta["lora"]
        return {
            "base_model": meta["base_model"],
            "is_lora": True,
            "lora_rank": lora["rank"],
            "train_unembed": lora["train_unembed"],
            "train_mlp": lora["train_mlp"],
            "train_attn": lora["train_attn"],
        }


def check_optimizer(kind: Optional[str], field: str) -> None:
    if kind not in (None, "adamw", "adam"):
        raise bad_field(field, f"'{kind}' is not supported by this server (AdamW only)")


def _future(future: Future, model_id: Optional[str]) -> Dict[str, Any]:
    return {"request_id": future.request_id, "model_id": model_id}


def _now() -> float:
    return time.monotonic()


__all__ = ["LORA_ALPHA", "Served", "TinkerService"]
