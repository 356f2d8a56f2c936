"""``explorer`` and ``synchronizer``: rollout engines, workflow runners, weight sync."""

from __future__ import annotations

from typing import Annotated, Dict, List, Literal, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel, Name
from trinity.common.config.schema_model import ExternalModelConfig

_VLLM_ONLY = "read by the vllm engine; other engines ignore it"
# Keys of InferenceModelConfig that only the vllm engine reads (its config_keys); set for
# another engine, validate.warn_inert says they do nothing.
VLLM_KEYS = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "enable_prefix_caching",
    "enable_chunked_prefill",
)


class InferenceModelConfig(ConfigModel):
    """``explorer.rollout_model`` and each of ``explorer.auxiliary_models``."""

    model_path: Optional[str] = Field(
        None,
        description="Model to serve (a folder or a hub id; an external API's model name); "
        "unset for rollout_model: model.model_path.",
    )
    engine_type: Optional[str] = Field(
        None,
        description="Inference engine, by its name in trinity.engine.ENGINES: transformers "
        "(unset: transformers), vllm (vLLM's library, an optional install: docs/guides/vllm.md), "
        "external (an OpenAI-compatible API, no engine started), tinker (a Tinker service's "
        "sampler of the adapter model.tinker trains; unset with model.tinker.enable: tinker), "
        "or one a plugin registers.",
    )
    external_model: ExternalModelConfig = Field(
        default_factory=ExternalModelConfig,
        description="The API of an auxiliary model with engine_type external (enable: true "
        "means engine_type external); the rollout model's is model.external_model.",
    )
    engine_num: int = Field(1, ge=1, description="Number of engines.")
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description=f"Tensor parallel degree per engine; > 1 is not supported yet ({_VLLM_ONLY}).",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Fraction of GPU memory a vllm engine may use; ignored on CPU (with a "
        f"warning), where its KV cache is sized from max_model_len ({_VLLM_ONLY}).",
    )
    enforce_eager: bool = Field(
        True,
        description="Run the model eagerly: no torch.compile or CUDA graphs (false: a slower "
        f"start for faster decoding) ({_VLLM_ONLY}).",
    )
    enable_prefix_caching: bool = Field(
        False, description=f"Reuse the KV cache of shared prompt prefixes ({_VLLM_ONLY})."
    )
    enable_chunked_prefill: bool = Field(
        False, description=f"Split long prefills into chunks ({_VLLM_ONLY})."
    )
    dtype: Optional[Literal["float32", "float16", "bfloat16"]] = Field(
        None,
        description="Weights dtype of the rollout engine; unset: bfloat16 on a GPU, float32 "
        "on CPU.",
    )
    seed: int = Field(42, description="Seed of the rollout engine's sampling.")
    enable_thinking: bool = Field(
        False,
        description="Passed to the chat template as enable_thinking (Qwen3's switch for its "
        "<think> block); templates that do not read it ignore it.",
    )
    tool_call_parser: Literal["hermes", "llama3_json", "mistral", "qwen3_coder"] = Field(
        "hermes",
        description="The format the OpenAI API reads a reply's tool calls in, when the "
        "request gave tools (hermes: <tool_call>{json}</tool_call>; qwen3_coder: its XML).",
    )
    enable_auto_tool_choice: bool = Field(
        False,
        description="vLLM's --enable-auto-tool-choice: the OpenAI API accepts tool_choice auto "
        "(also meant by tools without a tool_choice) and reads tool calls from replies with "
        "tool_call_parser; false refuses such requests with a 400 naming this key.",
    )
    reasoning_parser: Optional[Literal["deepseek_r1", "qwen3"]] = Field(
        None,
        description="The OpenAI API returns a reply's reasoning as reasoning_content, the rest "
        "as content, as vLLM's parser of that name does (a reply without </think> is all "
        "reasoning; qwen3 with enable_thinking false: all content); unset: all content.",
    )
    enable_history: bool = Field(False, description="Record every model call as an experience.")
    enable_openai_api: bool = Field(
        False, description="Serve the model through an OpenAI-compatible API."
    )
    openai_api_host: str = Field(
        "127.0.0.1",
        description="Address the OpenAI-compatible API listens on; 0.0.0.0: every interface.",
    )
    openai_api_port: int = Field(
        0, description="Port of the OpenAI-compatible API; 0: a free port per engine."
    )
    chat_template: Optional[str] = Field(
        None, description="Chat template string; unset: model.custom_chat_template."
    )
    max_model_len: Optional[int] = Field(
        None, description="Max sequence tokens; unset for rollout_model: model.max_model_len."
    )
    max_prompt_tokens: Optional[int] = Field(
        None, description="Max prompt tokens; unset for rollout_model: model.max_prompt_tokens."
    )
    max_response_tokens: Optional[int] = Field(
        None, description="Max new tokens; unset for rollout_model: model.max_response_tokens."
    )


class APIServerConfig(ConfigModel):
    """``explorer.api_server``: every OpenAI-compatible server the explorer binds (mode
    serve's endpoint, the rollout model's API, auxiliary models' APIs): who may call it and
    how much one request may ask. Beyond a limit a request gets a 4xx naming it."""

    api_key_env: str = Field(
        "TRINITY_API_KEY",
        description="Env var holding the API key (vLLM's --api-key; clients send "
        "Authorization: Bearer <key>). Set: every route requires it. Unset: only loopback "
        "addresses may be bound.",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body in bytes; beyond it a 413 before the body is read.",
    )
    max_n: int = Field(
        64,
        ge=1,
        description="Most samples one request may ask for: n (times the prompts of a "
        "completion); max_tokens is bounded by the model's max_model_len.",
    )
    max_messages: int = Field(1024, ge=1, description="Most messages in one chat request.")
    max_in_flight: int = Field(
        256,
        ge=1,
        description="Requests handled at once; one more gets a 503 with Retry-After, never a "
        "queue.",
    )
    read_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client has to send a request's head, then its body (408), and "
        "to take each part of the reply; a stalled client then loses its connection.",
    )


class OverRolloutConfig(ConfigModel):
    """``explorer.over_rollout``: proceed before the slowest tasks finish."""

    ratio: float = Field(0.0, description="Fraction of a batch's tasks not waited for.")
    wait_after_min: float = Field(30.0, description="Seconds to wait after the minimum arrived.")


class DynamicTimeoutConfig(ConfigModel):
    """``explorer.dynamic_timeout``: per-task timeout from observed task times."""

    enable: bool = Field(False, description="Adapt the timeout.")
    ratio: float = Field(3.0, description="Timeout = mean successful task time * ratio.")


class ExplorerConfig(ConfigModel):
    """``explorer``: rollout models and the workflow runners that use them."""

    name: Name = Field(
        "explorer", description="Name of the explorer's Ray actor (or thread) and log/<name>.log."
    )
    runner_per_model: int = Field(8, ge=1, description="Workflow runners per rollout engine.")
    concurrent_mode: Literal["sequential", "asynchronous", "multi-threading"] = Field(
        "sequential",
        description="Tasks per runner at once: sequential = one; multi-threading = a step's "
        "batch spread over the runners, one thread each (workflows must be thread-safe); "
        "asynchronous = as many, as coroutines on one event loop (Workflow.run_async).",
    )
    max_repeat_times_per_runner: Optional[int] = Field(
        None, ge=1, description="Split a task's repeats into runs of at most this many."
    )
    max_timeout: float = Field(900, ge=1, description="Seconds a workflow may take.")
    max_retry_times: int = Field(
        2,
        ge=0,
        description="Retries of a task whose workflow raised, timed out or lost its runner.",
    )
    max_failed_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1,
        description="The run fails when this fraction of a step's tasks failed after retries "
        "(1.0: only when all did; 0: at the first failure).",
    )
    env_vars: Dict[str, str] = Field(
        default_factory=dict, description="Environment variables of every runner."
    )
    rollout_model: InferenceModelConfig = Field(
        default_factory=InferenceModelConfig, description="The model being trained, for rollout."
    )
    auxiliary_models: List[InferenceModelConfig] = Field(
        default_factory=list, description="Extra models workflows may call (e.g. a judge)."
    )
    eval_interval: int = Field(100, ge=1, description="Evaluate every this many steps.")
    eval_on_startup: bool = Field(True, description="Evaluate the initial model at step 0.")
    bench_on_latest_checkpoint: bool = Field(
        False, description="Mode bench: evaluate only the run's newest checkpoint."
    )
    bench_checkpoints: List[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="Mode bench: the train steps of the checkpoints to evaluate (0: the base "
        "model); empty: every complete checkpoint, and step 0 with eval_on_startup.",
    )
    over_rollout: OverRolloutConfig = Field(
        default_factory=OverRolloutConfig, description="Over-rollout (experimental)."
    )
    dynamic_timeout: DynamicTimeoutConfig = Field(
        default_factory=DynamicTimeoutConfig, description="Dynamic timeout (experimental)."
    )
    runner_state_report_interval: float = Field(
        0, ge=0, description="Seconds between runner status reports; 0 is off."
    )
    listen_address: str = Field(
        "127.0.0.1",
        description="Mode serve: the address the OpenAI-compatible endpoint (with /feedback "
        "and /commit) listens on; 0.0.0.0: every interface.",
    )
    proxy_port: int = Field(
        8010,
        ge=0,
        le=65535,
        description="Mode serve: the port of that endpoint; 0: a free port, printed at start.",
    )
    api_server: APIServerConfig = Field(
        default_factory=APIServerConfig,
        description="API key and request limits of every OpenAI-compatible server the "
        "explorer binds (mode serve's endpoint, the rollout and auxiliary models' APIs).",
    )


class SynchronizerConfig(ConfigModel):
    """``synchronizer``: how and when trainer weights reach the explorer."""

    sync_method: Optional[Literal["nccl", "checkpoint", "memory"]] = Field(
        None,
        description=(
            "Weight transport. memory: through memory (Ray's object store); checkpoint: the "
            "checkpoint the trainer saves, read by the engines; nccl (mode both): the trainer "
            "broadcasts to the rollout engines over torch.distributed, NCCL between GPUs and "
            "gloo on CPU, and waits in each broadcast until they join (not with vLLM's GPU "
            "build yet). Unset: memory in modes both, colocate and serve, checkpoint otherwise."
        ),
    )
    sync_interval: int = Field(1, ge=1, description="Steps between weight syncs.")
    sync_offset: int = Field(0, ge=0, description="Steps the explorer runs ahead of the trainer.")
    sync_timeout: float = Field(
        3600, ge=1, description="Seconds to wait for the other side of a sync."
    )
    sync_style: Literal["fixed", "explorer_driven", "trainer_driven", "fully_async"] = Field(
        "fixed",
        description=(
            "Who decides when to sync. fixed: the schedule of sync_interval/sync_offset; "
            "explorer_driven / trainer_driven: neither side waits, weights change at explore "
            "step boundaries; fully_async: no step boundary either, the explorer keeps every "
            "runner busy and loads new weights between tasks."
        ),
    )
    max_staleness: Optional[int] = Field(
        None,
        ge=0,
        description=(
            "The trainer drops experiences sampled by weights more than this many versions "
            "older than the ones it updates (whole groups; counted as staleness/dropped); in "
            "the dynamic styles the explorer waits for weights recent enough instead of "
            "exploring a step only to have it dropped. Unset: sync_interval + sync_offset + 1 "
            "in the dynamic styles, off in fixed."
        ),
    )
