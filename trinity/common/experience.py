"""Experiences: what a workflow returns, and the padded batch the trainer consumes.

An ``Experience`` is one sequence: prompt tokens followed by response tokens.
Per-token fields (``logprobs``, ``action_mask``, ``advantages``, ``returns``)
cover the *response* part only, so their length is ``len(tokens) - prompt_length``.

``ExperienceBatch`` pads a list of experiences into tensors with the prompt
left-padded to ``P`` columns and the response right-padded to ``R`` columns, so
response token ``j`` of every row sits at column ``P + j`` (veRL's layout).
It also reads and writes as veRL's ``DataProto`` (``.batch``, ``.non_tensor_batch``,
``.meta_info``), so advantage code written against veRL runs on it unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch


def _as_long(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.long)


def _as_float(x: Any) -> torch.Tensor:
    return x.float() if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.float)


@dataclass
class Experience:
    """One trajectory (prompt + response) and everything the trainer needs to learn from it."""

    tokens: Any  # (L,) token ids, prompt then response; lists are converted to a LongTensor
    prompt_length: int  # number of prompt tokens at the start of ``tokens``
    reward: Optional[float] = None  # scalar reward of the whole response
    logprobs: Optional[Any] = None  # (L - prompt_length,) rollout logprobs of response tokens
    action_mask: Optional[Any] = None  # (L - prompt_length,) 1 where the model generated the token
    advantages: Optional[torch.Tensor] = None  # (L - prompt_length,) set by an AdvantageFn
    returns: Optional[torch.Tensor] = None  # (L - prompt_length,) set by an AdvantageFn
    info: Dict[str, Any] = field(default_factory=dict)  # free-form, e.g. reward components
    metrics: Dict[str, float] = field(
        default_factory=dict
    )  # numbers averaged into explorer metrics
    # experiences of one task share it (GRPO groups): the runner sets it to the task's id
    # followed by what the workflow set (e.g. "/judge": a second group of the same task)
    group_id: str = ""
    eid: str = field(default_factory=lambda: uuid.uuid4().hex)  # unique id of this experience
    model_version: int = 0  # trainer step of the weights that produced it; set by the runner
    prompt_text: Optional[str] = None
    response_text: Optional[str] = None
    # Multi-turn episodes (``merge_turns``): where each turn's reply starts, as an offset into
    # the response, and the environment state each reply answered (GiGPO groups turns by it).
    turn_starts: Optional[List[int]] = None
    turn_states: Optional[List[str]] = None

    def __post_init__(self) -> None:
        self.tokens = _as_long(self.tokens)
        n_resp = len(self.tokens) - int(self.prompt_length)
        if n_resp < 0:
            raise ValueError(
                f"Experience.prompt_length={self.prompt_length} exceeds "
                f"len(tokens)={len(self.tokens)}"
            )
        self.prompt_length = int(self.prompt_length)
        if self.logprobs is not None:
            self.logprobs = _as_float(self.logprobs)
        if self.action_mask is None:
            self.action_mask = torch.ones(n_resp, dtype=torch.bool)
        else:
            self.action_mask = _as_long(self.action_mask).bool()
        for name in ("logprobs", "action_mask", "advantages", "returns"):
            value = getattr(self, name)
            if value is not None and len(value) != n_resp:
                raise ValueError(
                    f"Experience.{name} has length {len(value)}, expected the response "
                    f"length {n_resp} (len(tokens) - prompt_length)"
                )
        if self.turn_states is not None and len(self.turn_states) != len(self.turn_starts or ()):
            raise ValueError(
                f"Experience.turn_states has {len(self.turn_states)} entries and turn_starts "
                f"{len(self.turn_starts or ())}: give one state per turn"
            )

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    # Every experience crosses three processes (runner, queue, trainer) and is written to the
    # queue's store: pickling tensors as numpy arrays is ~10x faster than torch's reducer.
    def __getstate__(self) -> Dict[str, Any]:
        return {k: _to_numpy(v) for k, v in self.__dict__.items()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update({k: _from_numpy(v) for k, v in state.items()})


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16:  # numpy has no bf16
        return value.detach().cpu().numpy()
    return value


def _from_numpy(value: Any) -> Any:
    if isinstance(value, np.ndarray):  # only tensors become arrays in __getstate__
        # Arrays unpickled from Ray's object store are read-only views: own a copy.
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return value


def grouped(experiences: List[Experience]) -> List[Experience]:
    """Experiences with each ``group_id``'s members next to each other (first-seen order).

    A task split by ``max_repeat_times_per_runner`` finishes in pieces, in any order, and a
    served task's responses are recorded between others'; the buffer reads groups as
    contiguous runs.
    """
    order: Dict[str, int] = {}
    for e in experiences:
        order.setdefault(e.group_id, len(order))
    return sorted(experiences, key=lambda e: order[e.group_id])


@dataclass
class ExperienceBatch:
    """A padded batch of experiences; tensor names are what loss functions ask for.

    Shapes: ``B`` rows, ``P`` prompt columns (left-padded), ``R`` response columns
    (right-padded), ``T = P + R``. ``batch``, ``non_tensor_batch`` and ``meta_info`` present
    it as veRL's ``DataProto`` (same tensors, veRL's names).
    """

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens
    position_ids: torch.Tensor  # (B, T)
    action_mask: torch.Tensor  # (B, R) float, 1 on response tokens that count in the loss
    rewards: torch.Tensor  # (B,) scalar rewards (0 where missing)
    old_logprob: torch.Tensor  # (B, R) rollout logprobs (0 where missing)
    prompt_len: int  # P
    group_ids: List[str]
    experiences: List[Experience]
    advantages: Optional[torch.Tensor] = None  # (B, R)
    returns: Optional[torch.Tensor] = None  # (B, R)
    token_level_rewards: Optional[torch.Tensor] = None  # (B, R), reward on the last response token
    ref_logprob: Optional[torch.Tensor] = None  # (B, R) reference-model logprobs
    extra: Dict[str, torch.Tensor] = field(default_factory=dict)
    # DataProto's per-row non-tensor fields other than "uid" (numpy arrays of length B).
    non_tensor: Dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: Dict[str, Any] = field(default_factory=dict)  # DataProto's batch-level info

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_len(self) -> int:
        return self.action_mask.shape[1]

    @property
    def batch(self) -> DataProtoTensors:
        """The tensors under veRL's ``DataProto.batch`` names, read and written in place."""
        return DataProtoTensors(self)

    @property
    def non_tensor_batch(self) -> DataProtoNonTensors:
        """veRL's ``DataProto.non_tensor_batch``: ``"uid"`` is the group ids as a numpy
        object array; other keys hold per-row numpy arrays."""
        return DataProtoNonTensors(self)

    def last_token_rewards(self) -> torch.Tensor:
        """``(B, R)`` zeros with each row's scalar reward on its last valid response token.

        "Valid" is the last action token; a row without any (e.g. all tokens came from an
        environment) falls back to its last response token, and an empty response to column
        0, so no reward is ever lost from the sequence score.
        """
        B, R = self.action_mask.shape
        response_attn = self.attention_mask[:, self.prompt_len :].to(self.action_mask.dtype)
        has_action = self.action_mask.sum(-1, keepdim=True) > 0
        mask = torch.where(has_action, self.action_mask, response_attn)
        columns = torch.arange(R, device=mask.device).expand(B, R)
        last = torch.where(mask > 0, columns, torch.zeros_like(columns)).max(dim=-1).values
        rewards = torch.zeros(B, R, device=mask.device)
        rewards[torch.arange(B, device=mask.device), last] = self.rewards.float()
        return rewards

    @classmethod
    def from_experiences(cls, exps: Sequence[Experience], pad_token_id: int) -> ExperienceBatch:
        if not exps:
            raise ValueError("cannot build an ExperienceBatch from no experiences")
        P = max(e.prompt_length for e in exps)
        R = max(max(e.response_length for e in exps), 1)
        B = len(exps)
        input_ids = torch.full((B, P + R), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((B, P + R), dtype=torch.long)
        action_mask = torch.zeros((B, R))
        old_logprob = torch.zeros((B, R))
        for i, e in enumerate(exps):
            p, r = e.prompt_length, e.response_length
            input_ids[i, P - p : P] = e.tokens[:p]
            input_ids[i, P : P + r] = e.tokens[p:]
            attention_mask[i, P - p : P + r] = 1
            action_mask[i, :r] = e.action_mask.float()
            if e.logprobs is not None:
                old_logprob[i, :r] = e.logprobs
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        rewards = torch.tensor([float(e.reward or 0.0) for e in exps])
        batch = cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            action_mask=action_mask,
            rewards=rewards,
            old_logprob=old_logprob,
            prompt_len=P,
            group_ids=[e.group_id for e in exps],
            experiences=list(exps),
        )
        for name in ("advantages", "returns"):
            if all(getattr(e, name) is not None for e in exps):
                t = torch.zeros((B, R))
                for i, e in enumerate(exps):
                    t[i, : e.response_length] = getattr(e, name)
                setattr(batch, name, t)
        return batch

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor a loss function parameter named ``name`` refers to."""
        aliases = {"logprobs": "old_logprob", "response_mask": "action_mask"}
        name = aliases.get(name, name)
        value = getattr(self, name, None) if name != "extra" else None
        if value is None:
            value = self.extra.get(name)
        if not isinstance(value, torch.Tensor):
            raise KeyError(f"the experience batch has no tensor '{name}'")
        return value

    def select(self, idx: Sequence[int]) -> ExperienceBatch:
        """A sub-batch (micro-batch) of rows ``idx``, keeping the padding layout."""
        index = torch.as_tensor(list(idx), dtype=torch.long, device=self.input_ids.device)
        rows = list(idx)
        return self._map(
            lambda t: t.index_select(0, index),
            group_ids=[self.group_ids[i] for i in rows],
            experiences=[self.experiences[i] for i in rows],
            non_tensor={k: v[rows] for k, v in self.non_tensor.items()},
        )

    def to(self, device: torch.device) -> ExperienceBatch:
        """The same rows with every tensor on ``device`` (the batch itself when already there)."""
        if self.input_ids.device == torch.device(device):
            return self
        return self._map(lambda t: t.to(device, non_blocking=True))

    def _map(self, fn: Any, **rows: Any) -> ExperienceBatch:
        """A batch with ``fn`` applied to every tensor; ``rows`` replaces per-row fields."""

        def apply(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else fn(t)

        return ExperienceBatch(
            input_ids=apply(self.input_ids),
            attention_mask=apply(self.attention_mask),
            position_ids=apply(self.position_ids),
            action_mask=apply(self.action_mask),
            rewards=apply(self.rewards),
            old_logprob=apply(self.old_logprob),
            prompt_len=self.prompt_len,
            group_ids=rows.get("group_ids", list(self.group_ids)),
            experiences=rows.get("experiences", list(self.experiences)),
            advantages=apply(self.advantages),
            returns=apply(self.returns),
            token_level_rewards=apply(self.token_level_rewards),
            ref_logprob=apply(self.ref_logprob),
            extra={k: apply(v) for k, v in self.extra.items()},
            non_tensor=rows.get("non_tensor", dict(self.non_tensor)),
            meta_info=dict(self.meta_info),
        )


# veRL DataProto name -> ExperienceBatch attribute, for tensors stored as attributes.
_VERL_ATTRIBUTES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "response_mask": "action_mask",
    "old_log_probs": "old_logprob",
    "ref_log_prob": "ref_logprob",
    "token_level_rewards": "token_level_rewards",
    "advantages": "advantages",
    "returns": "returns",
}
_REQUIRED = ("input_ids", "attention_mask", "position_ids", "response_mask", "old_log_probs")
_FULL_WIDTH = ("input_ids", "attention_mask", "position_ids")  # (B, T); the others are (B, R)
_RESPONSE_SHAPED = ("token_level_scores", "values") + tuple(
    k for k in _VERL_ATTRIBUTES if k not in _FULL_WIDTH
)


class DataProtoTensors(MutableMapping):
    """``ExperienceBatch.batch``: its tensors under veRL's names (a TensorDict stand-in).

    ``prompts``/``responses`` are ``input_ids[:, :P]``/``input_ids[:, P:]``;
    ``response_mask`` is ``action_mask``; ``old_log_probs`` the rollout logprobs;
    ``ref_log_prob``, ``token_level_rewards``, ``advantages`` and ``returns`` the
    attributes of those names; ``values`` and any other name live in ``extra``.
    ``token_level_scores`` (the reward on each row's last valid token, as veRL's reward
    step writes it) and ``token_level_rewards`` (the scores, when no KL penalty set them)
    are created on first read and stored, so later reads and in-place edits share them.
    Reads return the stored tensors (no copies); assignments replace them.
    """

    def __init__(self, data: ExperienceBatch) -> None:
        self._data = data

    @property
    def batch_size(self) -> torch.Size:
        return torch.Size([len(self._data)])

    def __getitem__(self, key: str) -> torch.Tensor:
        data = self._data
        if key == "prompts":
            return data.input_ids[:, : data.prompt_len]
        if key == "responses":
            return data.input_ids[:, data.prompt_len :]
        if key == "token_level_scores" and key not in data.extra:
            data.extra[key] = data.last_token_rewards()
        if key == "token_level_rewards" and data.token_level_rewards is None:
            data.token_level_rewards = self["token_level_scores"].clone()
        value = getattr(data, _VERL_ATTRIBUTES[key]) if key in _VERL_ATTRIBUTES else None
        if value is None:
            value = data.extra.get(key)
        if value is None:
            raise KeyError(f"the batch has no tensor '{key}' (present: {', '.join(self)})")
        return value

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        data = self._data
        self._check_shape(key, value)
        if key in ("prompts", "responses"):
            self[key].copy_(value)  # slices of input_ids: write through to the rows
        elif key in _VERL_ATTRIBUTES:
            setattr(data, _VERL_ATTRIBUTES[key], value)
        else:
            data.extra[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _REQUIRED or key in ("prompts", "responses"):
            raise KeyError(f"'{key}' is part of every batch and cannot be removed")
        if key in _VERL_ATTRIBUTES and getattr(self._data, _VERL_ATTRIBUTES[key]) is not None:
            setattr(self._data, _VERL_ATTRIBUTES[key], None)
        elif key in self._data.extra:
            del self._data.extra[key]
        else:
            raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in set(self)  # without creating the derived tensors

    def __iter__(self) -> Iterator[str]:
        yield from ("prompts", "responses")
        for name, attr in _VERL_ATTRIBUTES.items():
            if name in ("token_level_rewards", "token_level_scores"):
                continue  # always readable, listed below
            if getattr(self._data, attr) is not None:
                yield name
        yield from ("token_level_scores", "token_level_rewards")
        yield from (k for k in self._data.extra if k != "token_level_scores")

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _check_shape(self, key: str, value: torch.Tensor) -> None:
        data = self._data
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"batch['{key}'] must be a torch.Tensor, got {type(value).__name__}")
        if key in _FULL_WIDTH or key in ("prompts", "responses"):
            expected = tuple(self[key].shape)
        elif key in _RESPONSE_SHAPED:
            expected = tuple(data.action_mask.shape)
        else:
            expected = (len(data),) + tuple(value.shape[1:])
        if tuple(value.shape) != expected:
            raise ValueError(f"batch['{key}'] must have shape {expected}, got {tuple(value.shape)}")


class DataProtoNonTensors(MutableMapping):
    """``ExperienceBatch.non_tensor_batch``: ``"uid"`` reads the group ids as a numpy object
    array and writing it sets them; other keys are per-row numpy arrays kept on the batch."""

    def __init__(self, data: ExperienceBatch) -> None:
        self._data = data

    def __getitem__(self, key: str) -> np.ndarray:
        if key == "uid":
            return np.array(self._data.group_ids, dtype=object)
        return self._data.non_tensor[key]

    def __setitem__(self, key: str, value: Any) -> None:
        value = np.asarray(value, dtype=object)
        if value.shape[:1] != (len(self._data),):
            raise ValueError(
                f"non_tensor_batch['{key}'] needs one entry per row ({len(self._data)}), "
                f"got shape {value.shape}"
            )
        if key == "uid":
            self._data.group_ids = [str(v) for v in value]
        else:
            self._data.non_tensor[key] = value

    def __delitem__(self, key: str) -> None:
        if key == "uid":
            raise KeyError("'uid' (the group ids) is part of every batch and cannot be removed")
        del self._data.non_tensor[key]

    def __iter__(self) -> Iterator[str]:
        yield "uid"
        yield from self._data.non_tensor

    def __len__(self) -> int:
        return 1 + len(self._data.non_tensor)
