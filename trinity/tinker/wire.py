"""The JSON request bodies the SDK sends, read into pydantic models.

Only the fields this server uses are declared; others (``type`` tags, fields a newer SDK
adds) are ignored, so an SDK a little ahead of the server still works. JSON types are not
converted (strict), and NaN or infinity is refused. ``parse`` turns a validation error into
a 400 naming the field's path, as every 4xx of this project does.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Type, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trinity.engine.openai_protocol import field_path, most_specific
from trinity.tinker.errors import TinkerError, bad_field

T = TypeVar("T", bound="Body")

# The largest LoRA rank a request may ask for: far above any useful rank, it bounds the
# memory one create_model can take.
MAX_RANK = 1024


class Body(BaseModel):
    model_config = ConfigDict(
        extra="ignore", strict=True, allow_inf_nan=False, protected_namespaces=()
    )


def parse(cls: Type[T], raw: bytes) -> T:
    """``raw`` (a JSON body) as ``cls``; a 400 naming the field otherwise."""
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise TinkerError(400, f"body: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TinkerError(400, f"body: a JSON object is expected, not {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        error = most_specific(exc.errors())
        raise bad_field(field_path(error.get("loc", ())) or "body", error.get("msg", "")) from None


class SessionRef(Body):
    session_id: str


class CreateSession(Body):
    tags: List[str] = []
    user_metadata: Optional[Dict[str, Any]] = None
    sdk_version: str = ""
    display_name: Optional[str] = None


class LoraConfig(Body):
    rank: int = Field(ge=1, le=MAX_RANK)
    seed: Optional[int] = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(Body):
    type: str = "adamw"


class CreateModel(Body):
    session_id: str
    model_seq_id: int = Field(ge=0)
    base_model: str
    user_metadata: Optional[Dict[str, Any]] = None
    lora_config: Optional[LoraConfig] = None
    optimizer_config: OptimizerConfig = OptimizerConfig()


class ModelRef(Body):
    model_id: str


class AdamParams(Body):
    """``torch.optim.AdamW``'s hyperparameters for one step, with the SDK's defaults."""

    learning_rate: float = Field(0.0001, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)
    type: Optional[str] = None  # another optimizer family's params carry their name here


class OptimStep(Body):
    model_id: str
    seq_id: Optional[int] = None
    # the SDK writes Adam's params as adam_params, another family's as optimizer_params
    adam_params: Optional[AdamParams] = None
    optim_params: Optional[AdamParams] = None
    optimizer_params: Optional[Dict[str, Any]] = None


class SaveWeights(Body):
    model_id: str
    path: Optional[str] = None
    seq_id: Optional[int] = None
    overwrite: bool = False
    user_metadata: Optional[Dict[str, str]] = None
    # for_sampler only: an unnamed save makes a sampling session instead of a checkpoint
    sampling_session_seq_id: Optional[int] = None
    kind: str = "snapshot"


class LoadWeights(Body):
    path: str
    optimizer: bool
    model_id: Optional[str] = None  # onto a model that exists ...
    seq_id: Optional[int] = None
    session_id: Optional[str] = None  # ... or onto a new one (create-via-load)
    model_seq_id: Optional[int] = Field(None, ge=0)
    base_model: Optional[str] = None
    user_metadata: Optional[Dict[str, Any]] = None


class CreateSamplingSession(Body):
    session_id: str
    sampling_session_seq_id: int = Field(ge=0)
    base_model: Optional[str] = None
    model_path: Optional[str] = None


class SamplingSessionRef(Body):
    sampling_session_id: str


class Chunk(Body):
    type: str = "encoded_text"
    tokens: Optional[List[int]] = None


class ModelInput(Body):
    chunks: List[Chunk]


class SamplingParams(Body):
    max_tokens: Optional[int] = Field(None, ge=1)
    seed: Optional[int] = None
    stop: Union[str, List[int], List[str], None] = None
    temperature: float = Field(1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(1.0, gt=0, le=1)


class Sample(Body):
    num_samples: int = Field(1, ge=1)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: Optional[str] = None
    model_path: Optional[str] = None
    sampling_session_id: Optional[str] = None
    seq_id: Optional[int] = None
    prompt_logprobs: Optional[bool] = None
    topk_prompt_logprobs: int = Field(0, ge=0)
    topk_sample_logprobs: int = Field(0, ge=0)
    target_prompt_logprobs: Optional[Dict[str, Any]] = None
    prompt_alt_tokens_k: int = Field(0, ge=0)
    prompt_logprobs_last_n: Optional[int] = Field(None, ge=1)
    record_stability_info: Optional[bool] = None


class RetrieveFuture(Body):
    request_id: str
    allow_metadata_only: bool = False


class FinishSession(Body):
    reason: Optional[Dict[str, Any]] = None
    detail: Optional[str] = None


class WeightsInfo(Body):
    tinker_path: str


def prompt_tokens(prompt: ModelInput, field: str) -> List[int]:
    """The token ids of a ``ModelInput``: text chunks only (no images or audio here)."""
    tokens: List[int] = []
    for i, chunk in enumerate(prompt.chunks):
        if chunk.type != "encoded_text" or chunk.tokens is None:
            raise bad_field(
                f"{field}.chunks[{i}].type",
                f"'{chunk.type}' chunks are not supported by this server (text models: "
                "encoded_text chunks of token ids only)",
            )
        tokens.extend(chunk.tokens)
    return tokens


Kind = Literal["weights", "sampler_weights"]
