"""``buffer``: tasksets in, experiences between explorer and trainer, auxiliary data."""

from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field

from trinity.common.config.base import ConfigModel, Name, inert


class FormatConfig(ConfigModel):
    """``format``: which dataset columns hold what, and how prompts are built."""

    prompt_type: Literal["plaintext", "messages"] = Field(
        "plaintext", description="plaintext: the prompt is a string; messages: a message list."
    )
    prompt_key: str = Field("prompt", description="Column of the user prompt (plaintext).")
    response_key: str = Field("response", description="Column of the response (plaintext).")
    system_prompt_key: Optional[str] = Field(
        None, description="Column of the system prompt (plaintext); wins over system_prompt."
    )
    system_prompt: Optional[str] = Field(None, description="System prompt text (plaintext).")
    messages_key: str = Field("message", description="Column of the message list (messages).")
    tools_key: str = Field("tools", description="Column of the tool list (list of dicts).")
    chosen_key: str = Field("chosen", description="Column of the DPO chosen response.")
    rejected_key: str = Field("rejected", description="Column of the DPO rejected response.")
    enable_concatenated_multi_turn: bool = Field(
        False, description="SFT on messages: train on every assistant turn of a conversation."
    )
    chat_template: Optional[str] = Field(
        None, description="Chat template string; unset: model.custom_chat_template."
    )
    image_key: Optional[str] = Field(
        None, description="Column of a task's images (multimodal tasks: not supported yet)."
    )
    video_key: Optional[str] = Field(
        None, description="Column of a task's videos (multimodal tasks: not supported yet)."
    )


# OpenAI's limit on top_logprobs, which the engine follows.
MAX_TOP_LOGPROBS = 20


class GenerationConfig(ConfigModel):
    """``rollout_args``: sampling parameters of one taskset."""

    temperature: float = Field(1.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, description="Nucleus sampling mass; 1.0 is off.")
    top_k: int = Field(-1, description="Top-k sampling; -1 is off.")
    n: int = Field(1, description="Samples per prompt; set to the taskset's repeat_times.")
    logprobs: int = Field(
        0, description="Most likely alternatives returned per token (info['top_logprobs'])."
    )
    max_tokens: Optional[int] = Field(
        None, description="Max new tokens; unset: model.max_response_tokens."
    )
    stop: Optional[List[str]] = Field(None, description="Strings that end a response.")


class TaskSelectorConfig(ConfigModel):
    """``task_selector`` (alias ``data_selector``): the order in which tasks are read."""

    selector_type: str = Field(
        "sequential",
        description="sequential: file order; shuffle: reshuffled every epoch; random: each "
        "batch drawn afresh; offline_easy2hard: sorted by feature_keys; diff_based (or "
        "difficulty_based): tasks whose success rate is nearest kwargs.target_reward, learned "
        "from the rewards; or a selector registered by a plugin (docs/extending.md).",
    )
    seed: int = Field(42, description="Seed of shuffle, random and diff_based draws.")
    feature_keys: List[str] = Field(
        default_factory=list,
        description="Numeric columns the selector reads: offline_easy2hard sorts by them; "
        "diff_based takes one as each task's prior success rate in [0, 1].",
    )
    kwargs: Dict[str, Any] = Field(
        default_factory=dict,
        description="Selector arguments, checked before start. offline_easy2hard: descending; "
        "diff_based: target_reward, tau, do_sample, lamb, prior_rollouts.",
    )


class ReplayBufferConfig(ConfigModel):
    """``replay_buffer``: experience reuse for queue buffers."""

    enable: bool = Field(False, description="Reuse experiences from the queue.")
    reuse_cooldown_time: Optional[float] = Field(
        None, ge=0.0, description="Seconds before an experience may be reused; null: never."
    )
    priority_fn: str = Field("linear_decay", description="Order in which experiences are reused.")
    priority_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Arguments of the priority function."
    )


class ReasoningGymDataset(ConfigModel):
    """One reasoning-gym dataset of a ``reasoning_gym`` taskset (reasoning-gym's DatasetSpec)."""

    weight: float = Field(
        1.0, gt=0, description="Its share of the rows of a mix, relative to the others' weights."
    )
    config: Dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments of the dataset's config class (its difficulty: min_digits, "
        "max_terms, ...); seed and size are the taskset's.",
    )


class ReasoningGymConfig(ConfigModel):
    """``reasoning_gym``: the reasoning-gym tasks of a ``storage_type: reasoning_gym`` taskset."""

    datasets: Dict[str, ReasoningGymDataset] = Field(
        default_factory=dict,
        description="reasoning-gym dataset name -> its weight and config; one dataset is "
        "reasoning_gym.create_dataset, several a weighted CompositeDataset.",
    )
    size: int = Field(500, ge=1, description="Rows generated.")
    seed: int = Field(
        42,
        ge=0,
        description="Row i is drawn from Random(seed + i): a held-out taskset's seed is at "
        "least another's seed + size.",
    )


class StorageConfig(ConfigModel):
    """One dataset or buffer: a (eval) taskset, the experience buffer or an auxiliary buffer."""

    # Upstream's configs also spell task_selector data_selector.
    ALIASES: ClassVar[Dict[str, str]] = {"data_selector": "task_selector"}

    name: Name = Field(
        "",
        description="Unique name: the label of its metrics (eval/<name>/...) and a queue or sql "
        "buffer's table (in buffer/<name>.db without a path); unset: derived.",
    )
    storage_type: str = Field(
        "file",
        description="file: jsonl/parquet; queue: the explorer-to-trainer queue, kept in a "
        "database; sql: a table of a SQL database (SQLite file or SQLAlchemy URL); "
        "reasoning_gym: tasks generated by reasoning-gym (the reasoning_gym key); or a "
        "storage registered by a plugin (docs/extending.md).",
    )
    path: Optional[str] = Field(
        None,
        description="Data directory or file, or a dataset's hub id (ORG/NAME, optionally "
        "@REVISION) read from the Hugging Face cache (file); SQLite file or SQLAlchemy URL "
        "(sql, queue; a sql taskset's table is its name).",
    )
    subset_name: Optional[str] = Field(None, description="`name` of datasets.load_dataset.")
    split: str = Field("train", description="`split` of datasets.load_dataset.")
    repeat_times: Optional[int] = Field(
        None, ge=1, description="Rollouts per task; unset: algorithm.repeat_times (eval: 1)."
    )
    format: FormatConfig = Field(default_factory=FormatConfig, description="Column mapping.")
    rollout_args: GenerationConfig = Field(
        default_factory=GenerationConfig, description="Sampling parameters."
    )
    default_workflow_type: Optional[str] = Field(
        None, description="Workflow of this dataset; unset: buffer.explorer_input's default."
    )
    default_reward_fn_type: Optional[str] = Field(
        None, description="Reward function; unset: buffer.explorer_input's default."
    )
    workflow_args: Dict[str, Any] = Field(
        default_factory=dict, description="Extra arguments passed to the workflow."
    )
    reward_fn_args: Dict[str, Any] = Field(
        default_factory=dict, description="Extra arguments passed to the reward function."
    )
    task_selector: TaskSelectorConfig = Field(
        default_factory=TaskSelectorConfig, description="Task order."
    )
    max_read_timeout: float = Field(
        1800,
        ge=0.0,
        description="Queue: seconds to wait for a full batch before returning a short one.",
    )
    replay_buffer: ReplayBufferConfig = Field(
        default_factory=ReplayBufferConfig, description="Experience reuse (queue only)."
    )
    enable_progress_bar: bool = inert(
        False,
        description="Show a progress bar while loading.",
        reason="rows load without one; the console shows the stage's progress",
    )
    total_epochs: Optional[int] = Field(
        None,
        ge=1,
        description="An auxiliary buffer's passes over its data before it runs out; unset: it "
        "repeats for the whole run (other datasets follow buffer.total_epochs).",
    )
    mm_data_kwargs: Optional[Dict[str, Any]] = Field(
        None, description="Multimodal data options (Trinity-RFT 0.3); not supported yet."
    )
    skip_bad_rows: bool = Field(
        False, description="file: skip (count and log) malformed rows instead of failing."
    )
    reasoning_gym: Optional[ReasoningGymConfig] = Field(
        None, description="storage_type reasoning_gym: the reasoning-gym datasets generated."
    )
    is_eval: bool = Field(False, description="Internal: set for eval tasksets.")


class ExplorerInput(ConfigModel):
    """``buffer.explorer_input``: the tasksets explored and evaluated."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {"task_set": "buffer.explorer_input.taskset"}
    # `taskset:` (one mapping) is shorthand for `tasksets:` (a list), which convert-verl writes.
    ALIASES: ClassVar[Dict[str, str]] = {"taskset": "tasksets"}

    tasksets: List[StorageConfig] = Field(
        default_factory=list, description="Training tasksets (`taskset:` sets a single one)."
    )
    eval_tasksets: List[StorageConfig] = Field(
        default_factory=list, description="Evaluation tasksets."
    )
    default_workflow_type: Optional[str] = Field(
        "math_workflow", description="Workflow of tasksets that set none."
    )
    default_eval_workflow_type: Optional[str] = Field(
        None, description="Workflow of eval tasksets that set none; unset: default_workflow_type."
    )
    default_reward_fn_type: Optional[str] = Field(
        None, description="Reward function of tasksets that set none."
    )

    @property
    def taskset(self) -> Optional[StorageConfig]:
        """The first training taskset, for code written against the single-taskset form."""
        return self.tasksets[0] if self.tasksets else None


class TrainerInput(ConfigModel):
    """``buffer.trainer_input``: what the trainer reads."""

    experience_buffer: Optional[StorageConfig] = Field(
        None, description="Trainer input / explorer output; unset: a queue named experience_buffer."
    )
    auxiliary_buffers: Dict[str, StorageConfig] = Field(
        default_factory=dict, description="Extra trainer datasets by name."
    )


class BufferConfig(ConfigModel):
    """``buffer``: batch sizes, training length, and the data sources."""

    MOVED_KEYS: ClassVar[Dict[str, str]] = {
        "default_workflow_type": "buffer.explorer_input.default_workflow_type",
        "default_reward_fn_type": "buffer.explorer_input.default_reward_fn_type",
    }

    batch_size: int = Field(1, ge=1, description="Tasks per explore step (not times repeat_times).")
    train_batch_size: Optional[int] = Field(
        None, ge=1, description="Experiences per train step; unset: batch_size * repeat_times."
    )
    total_epochs: int = Field(1, ge=1, description="Passes over the taskset.")
    total_steps: Optional[int] = Field(
        None, ge=1, description="Training steps; wins over total_epochs when set."
    )
    explorer_input: ExplorerInput = Field(
        default_factory=ExplorerInput, description="Explorer datasets."
    )
    trainer_input: TrainerInput = Field(default_factory=TrainerInput, description="Trainer data.")
