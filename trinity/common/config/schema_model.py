"""``model`` and ``cluster``: what is trained, its token limits, and the hardware."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel


class LoRAConfig(ConfigModel):
    """One entry of ``model.lora_configs`` (one is supported): the trainer trains a peft LoRA
    adapter on the frozen base model, and the rollout engines sample with merged weights."""

    name: Optional[str] = Field(None, description="Name of the adapter (a label in logs).")
    path: Optional[str] = Field(
        None,
        description="A pretrained peft adapter to start from: a folder or a hub id (its "
        "rank, alpha and targets win).",
    )
    base_model_name: Optional[str] = Field(
        None,
        description="Base model name written in the exported adapter_config.json; unset: "
        "model.model_path.",
    )
    lora_rank: int = Field(32, ge=1, description="Rank r of the adapter matrices.")
    lora_alpha: int = Field(
        32, gt=0.0, description="Scaling numerator: the update is alpha / r * B @ A."
    )
    lora_dtype: str = Field(
        "auto",
        description="Adapter parameters' dtype: auto (the model's), float32, bfloat16, float16.",
    )
    target_modules: Any = Field(
        "all-linear",
        description="Adapted Linear layers: all-linear, a list of names (q_proj, ...), or a "
        "regular expression over module paths.",
    )
    save_merged: bool = Field(
        False,
        description="Also export the merged model to hf/merged (a later stage starts from it).",
    )


class TinkerConfig(ConfigModel):
    """``model.tinker``: train a LoRA adapter in a Tinker service (``TINKER_BASE_URL``,
    ``TINKER_API_KEY``) and sample it there (``engine_type: tinker``); ``model.model_path`` is
    then the local tokenizer, and ``model.lora_configs`` is ignored."""

    enable: bool = Field(False, description="Train and sample through a Tinker service.")
    rank: int = Field(32, ge=1, description="LoRA rank of the adapter the service trains.")
    seed: Optional[int] = Field(
        None, description="Seed of the adapter's initialisation; unset: the service's choice."
    )
    train_mlp: bool = Field(True, description="Put LoRA on the MLP layers.")
    train_attn: bool = Field(True, description="Put LoRA on the attention layers.")
    train_unembed: bool = Field(True, description="Put LoRA on the unembedding layer.")
    base_model: Optional[str] = Field(
        None,
        description="The base model's name on the service (its capabilities list it); unset: "
        "model.model_path as written (a hub id names both it and the local tokenizer).",
    )


class ExternalModelConfig(ConfigModel):
    """An OpenAI-compatible API used in place of a local engine: ``model.external_model`` (the
    rollout model, modes explore and bench) or ``explorer.auxiliary_models[i].external_model``.
    The URL and key are read from environment variables, never written in the config."""

    enable: bool = Field(
        False, description="Use an external API model (same as engine_type: external)."
    )
    base_url_env: str = Field("OPENAI_BASE_URL", description="Env var holding the API base URL.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Env var holding the API key.")
    model_name: Optional[str] = Field(
        None, description="Model name sent to the API; unset: the entry's model_path."
    )


class ModelConfig(ConfigModel):
    """``model``: the model under training and its token limits."""

    model_path: str = Field(
        "",
        description="The model: a local Hugging Face folder, or a hub id (ORG/NAME, "
        "optionally @REVISION) read from the Hugging Face cache, downloaded there if missing.",
    )
    critic_model_path: str = Field(
        "", description="Critic model (a folder or a hub id); empty: model_path."
    )
    custom_chat_template: Optional[str] = Field(
        None, description="Chat template string; unset: the tokenizer's."
    )
    chat_template_path: Optional[str] = Field(
        None,
        description="Jinja2 chat template file, or a tokenizer (folder or hub id) whose chat "
        "template is used; wins over custom_chat_template.",
    )
    max_model_len: Optional[int] = Field(
        None,
        ge=1,
        description="Max tokens of a sequence; unset: max_prompt_tokens + max_response_tokens.",
    )
    max_prompt_tokens: Optional[int] = Field(None, ge=1, description="Max prompt tokens.")
    max_response_tokens: Optional[int] = Field(None, ge=1, description="Max generated tokens.")
    min_response_tokens: int = Field(
        1, ge=0, description="Min generated tokens (< max_response_tokens)."
    )
    enable_prompt_truncation: bool = Field(
        True, description="Keep only the last max_prompt_tokens tokens of longer prompts."
    )
    repetition_penalty: float = Field(1.0, gt=0.0, description="Repetition penalty; 1.0 is off.")
    temperature: Optional[float] = Field(
        None, description="Sampling temperature of every taskset that sets none in rollout_args."
    )
    top_p: Optional[float] = Field(
        None, description="top_p of every taskset that sets none in rollout_args."
    )
    top_k: Optional[int] = Field(
        None, description="top_k of every taskset that sets none in rollout_args."
    )
    logprobs: Optional[int] = Field(
        None, description="logprobs of every taskset that sets none in rollout_args."
    )
    lora_configs: Optional[List[LoRAConfig]] = Field(
        None, description="LoRA adapters (one supported)."
    )
    rope_scaling: Optional[Dict[str, Any]] = Field(None, description="RoPE scaling override.")
    rope_theta: Optional[float] = Field(None, description="RoPE theta override.")
    tinker: TinkerConfig = Field(default_factory=TinkerConfig, description="Tinker training.")
    external_model: ExternalModelConfig = Field(
        default_factory=ExternalModelConfig, description="External API rollout model."
    )


class ClusterConfig(ConfigModel):
    """``cluster``: nodes and GPUs."""

    node_num: int = Field(
        1,
        ge=1,
        description="Ray nodes the run takes; >= 2 (CPU only): the trainer on the driver's "
        "node, the rollout engines on the others (needs RAY_ADDRESS).",
    )
    gpu_per_node: Optional[int] = Field(
        None, ge=0, description="GPUs per node; unset: the GPUs detected on this machine."
    )
    in_process: bool = Field(
        True,
        description="Run a one-node stage in trinity run's own process, without Ray, when it "
        "needs no other (runtime/local_stage.py); false: every role a Ray actor, so a task "
        "past explorer.max_timeout has its runner process killed.",
    )
