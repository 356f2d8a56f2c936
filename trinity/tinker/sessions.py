"""Sessions, training models and samplers: who holds what on this server.

The SDK opens a session per ``ServiceClient``, heartbeats it every 10 s and finishes it on
``close``; a session's training models (``<session>:train:<n>``, the id the SDK derives
too) and samplers (``<session>:sample:<n>``) go with it. A session finished, or silent for
``SESSION_TIMEOUT_S``, has its models unloaded: their adapters free the base model's memory.
Only the event loop touches these records.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from trinity.tinker.errors import TinkerError, not_found
from trinity.tinker.lora_models import LoraSpec
from trinity.tinker.sampler import AdapterWeights

SESSION_TIMEOUT_S = 600.0


@dataclass
class Session:
    session_id: str
    user_metadata: Optional[Dict[str, Any]] = None
    display_name: Optional[str] = None
    heartbeat: float = field(default_factory=time.monotonic)
    finished: bool = False
    models: List[str] = field(default_factory=list)
    samplers: List[str] = field(default_factory=list)
    clients: int = 0  # join_sampling_session's counter


@dataclass
class TrainingModel:
    model_id: str
    session_id: str
    base_model: str
    spec: LoraSpec
    user_metadata: Optional[Dict[str, Any]] = None
    last_request: float = field(default_factory=time.time)
    seen: Dict[int, str] = field(default_factory=dict)  # seq_id -> request id: resends
    samplers: int = 0  # unnamed save_weights_for_sampler calls so far


@dataclass
class SamplerRecord:
    sampler_id: str
    session_id: str
    base_model: str
    model_path: Optional[str]
    weights: Optional[AdapterWeights] = None  # None: the base model, or expired
    clients: int = 0
    expired: bool = False  # an unnamed sampler whose weights newer ones replaced


class Registry:
    """Sessions, models and samplers by id."""

    def __init__(self) -> None:
        self.sessions: Dict[str, Session] = {}
        self.models: Dict[str, TrainingModel] = {}
        self.samplers: Dict[str, SamplerRecord] = {}

    def open(self, user_metadata: Any, display_name: Optional[str]) -> Session:
        session = Session(uuid.uuid4().hex, user_metadata, display_name)
        self.sessions[session.session_id] = session
        return session

    def session(self, session_id: str, field: str = "session_id") -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found(field, session_id, "session")
        if session.finished:
            # 410: the SDK's heartbeat stops on it, and it never retries it
            raise TinkerError(410, f"{field}: session '{session_id}' has finished", field)
        return session

    def model(self, model_id: str, field: str = "model_id") -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            raise not_found(field, model_id, "training model (unknown, or unloaded)")
        model.last_request = time.time()
        return model

    def sampler(self, sampler_id: str, field: str = "sampling_session_id") -> SamplerRecord:
        sampler = self.samplers.get(sampler_id)
        if sampler is None:
            raise not_found(field, sampler_id, "sampling session")
        return sampler

    def add_sampler(self, session: Session, record: SamplerRecord) -> SamplerRecord:
        self.samplers[record.sampler_id] = record
        session.samplers.append(record.sampler_id)
        return record

    def stale(self) -> List[Session]:
        """Open sessions that stopped heartbeating."""
        now = time.monotonic()
        return [
            s
            for s in self.sessions.values()
            if not s.finished and now - s.heartbeat > SESSION_TIMEOUT_S
        ]

    def close(self, session: Session) -> List[str]:
        """Finish ``session``; returns its models' ids (to unload) and drops its samplers."""
        session.finished = True
        for sampler_id in session.samplers:
            self.samplers.pop(sampler_id, None)
        models, session.models, session.samplers = session.models, [], []
        for model_id in models:
            self.models.pop(model_id, None)
        return models
