"""``VLLMEngine``: sampling with vLLM's offline ``LLM`` over its Python API.

The same surface as ``hf_engine.TransformersEngine`` (``PromptSide`` for prompts and limits,
``generate`` over token ids, ``load_state_dict``), so ``TransformersInferenceModel``'s batching,
conversations and experiences serve both. vLLM runs its model in processes of its own (its
engine core and one worker per tensor-parallel rank); this process keeps the tokenizer and
talks to them through ``LLM``.

Logprobs: vLLM's ``processed_logprobs`` mode, the log-softmax of the logits after
temperature, penalties and top-k/top-p, the distribution each token was sampled from. With
``top_p: 1`` and ``top_k: -1`` (the defaults, and what RL fine-tuning usually samples with)
that is ``log_softmax(logits / T)``, what the trainer recomputes. With top-k/top-p it is the
renormalized truncated distribution, while the trainer scores the whole one; the rollout
correction metrics (``rollout_corr/``) show that gap. ``raw_logprobs`` would ignore the
temperature, which the trainer applies. Greedy rows get ``T = 1``, as in the transformers engine.

Weights: the trainer's tensors go through a safetensors file (``/dev/shm`` where it exists)
that each worker reads into the model with vLLM's in-place reload (``vllm_worker.py``); then
every worker's checksums are compared with the trainer's (``vllm_worker.mismatches``): a
tensor the engine does not hold stops the run, naming it. With ``sync_method: nccl`` on CPU
this process joins the trainer's gloo broadcast and hands what it received on the same way
(``receive_weights``): vLLM's CPU build has no weight-transfer backend of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Dict, Iterator, List, Optional, TypeVar

import torch
from safetensors.torch import save_file

from trinity.common.config.schema_buffer import MAX_TOP_LOGPROBS
from trinity.common.models.sampling import SamplingParams
from trinity.common.weight_transfer import WeightReceiver, unheld
from trinity.common.weights import WeightSyncError, tensor_stats
from trinity.engine.hf_engine import SampleOutput
from trinity.engine.prompts import PromptSide
from trinity.engine.vllm_worker import TIED_OUTPUT, mismatches
from trinity.utils.output import log_folder, output_to

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WORKER_EXTENSION = "trinity.engine.vllm_worker.TrinityWorkerExtension"
# Share of the memory available at start that the KV cache may take on CPU, at most.
CPU_KV_SHARE = 0.25
# How often a call in flight checks that vLLM's engine core is still alive (seconds).
LIVENESS_POLL_S = 0.5
T = TypeVar("T")


class EngineDied(RuntimeError):
    """vLLM's processes have ended."""


@contextlib.contextmanager
def _alive() -> Iterator[None]:
    """vLLM's ``EngineDeadError`` as ``EngineDied``, saying what it means for the run."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        yield
    except EngineDeadError as exc:
        raise EngineDied(
            "the vllm engine's processes have ended (killed, or out of memory: see log/vllm.log "
            "in the run's folder); run the same command again to resume from the last "
            "checkpoint"
        ) from exc


def _watched(llm: Any, call: Callable[[], T]) -> T:
    """``call()``, which waits on vLLM's engine core, failing with ``EngineDied`` once that
    process is gone. vLLM's sync client (0.32) marks the engine dead when its process
    ends but never fails a call already waiting: a ``collective_rpc`` or a ``generate`` in
    flight when the engine core was killed waited forever (seen in the kill test), so the
    call runs in a thread of its own while this one watches the engine's liveness flag."""
    from vllm.v1.engine.exceptions import EngineDeadError

    done: Future = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:  # handed to the caller, whatever it is
            done.set_exception(exc)

    # daemon: a call stranded by a dead engine must not keep the process from exiting
    threading.Thread(target=run, daemon=True, name="vllm-call").start()
    resources = getattr(llm.llm_engine.engine_core, "resources", None)
    with _alive():
        while True:
            try:
                return done.result(timeout=LIVENESS_POLL_S)
            except FutureTimeout:
                if resources is not None and resources.engine_dead:
                    raise EngineDeadError(suppress_context=True) from None


class VLLMEngine(PromptSide):
    """Sample with vLLM from a local Hugging Face model folder."""

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        repetition_penalty: float = 1.0,
        seed: int = 0,
        max_num_seqs: int = 256,
        num_threads: Optional[int] = None,
        adapter_path: Optional[str] = None,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = False,
        enable_chunked_prefill: bool = False,
        **prompt_side: Any,
    ) -> None:
        """The arguments of ``TransformersEngine``, then vLLM's own (``vllm_model.py``'s
        ``config_keys``); ``num_threads`` is not used: vLLM's CPU worker binds its threads to
        the cores it is allowed."""
        if adapter_path is not None:  # refused before start (preflight); kept for direct use
            raise ValueError("the vllm engine does not start from a LoRA adapter yet")
        super().__init__(model_path, **prompt_side)
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(model_path)
        self.vocab_size = model_config.vocab_size
        self.tied = bool(getattr(model_config, "tie_word_embeddings", False))
        self.repetition_penalty = repetition_penalty
        self.dtype = _DTYPES[dtype]
        self.device = device
        memory: Dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
        if device == "cpu":
            memory = {
                "kv_cache_memory_bytes": cpu_kv_cache_bytes(
                    model_config, self.dtype, self.max_model_len, max_num_seqs
                )
            }
        self.llm = _start(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=self.max_model_len,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill,
            logprobs_mode="processed_logprobs",
            max_logprobs=MAX_TOP_LOGPROBS,
            worker_extension_cls=WORKER_EXTENSION,
            **memory,
        )

    # ---------------------------------------------------------------- sampling

    def generate(
        self, prompts: List[List[int]], params: List[SamplingParams]
    ) -> List[List[SampleOutput]]:
        """Sample ``params[i].n`` responses to each ``prompts[i]`` (token ids), in order."""
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(params):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        fitted = [self.fit(list(x), p) for x, p in zip(prompts, params, strict=True)]
        if not fitted:
            return []
        outputs = _watched(
            self.llm,
            lambda: self.llm.generate(
                [TokensPrompt(prompt_token_ids=prompt) for prompt, _ in fitted],
                [self._sampling(p) for _, p in fitted],
                use_tqdm=False,
            ),
        )
        return [
            [_sample(c, prompt, p.top_logprobs) for c in out.outputs]
            for (prompt, p), out in zip(fitted, outputs, strict=True)
        ]

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            stop=params.stop,
            # vLLM stops at the tokenizer's eos; these add the generation config's, as ours do
            stop_token_ids=sorted(set(self.eos_ids) | set(params.stop_token_ids or [])),
            repetition_penalty=self.repetition_penalty,
            logprobs=params.top_logprobs,  # the sampled token's, and this many more
            seed=params.seed,
            # replies' text is decoded here (experiences); vLLM needs it only for stop strings
            detokenize=bool(params.stop),
        )

    # ----------------------------------------------------------------- weights

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Load the trainer's tensors (checkpoint names) into every worker, then check that
        each worker holds them (``WeightSyncError`` names those it does not)."""
        start = time.monotonic()
        tensors = _as_stored(state_dict, self.dtype, self.tied)
        sent = {name: tensor_stats(tensor) for name, tensor in tensors.items()}
        folder = tempfile.mkdtemp(prefix="trinity-vllm-", dir=_shared_memory_dir())
        try:
            path = os.path.join(folder, "weights.safetensors")
            save_file(tensors, path)
            _watched(self.llm, lambda: self.llm.collective_rpc("trinity_load", args=(path,)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        _watched(self.llm, self.llm.reset_prefix_cache)  # its prompts had the old weights
        held = _watched(self.llm, lambda: self.llm.collective_rpc("trinity_checksums"))
        wrong = mismatches(sent, held, self.tied)
        if wrong:
            raise WeightSyncError(
                f"the vllm engine does not hold {len(wrong)} of the {len(tensors)} tensors it "
                f"was sent after loading them, e.g. {wrong[:3]}: its samples would come from "
                "other weights than the trainer's"
            )
        logger.info(
            "vllm engine loaded and checked %d tensors in %.2fs",
            len(tensors),
            time.monotonic() - start,
        )

    def receive_weights(self, receiver: WeightReceiver, version: int) -> None:
        """``sync_method: nccl`` with vLLM's CPU build, whose workers can join no broadcast
        on CPU: this process takes ``version`` from the trainer's gloo broadcast, checks it
        against the trainer's checksums, and hands it to the workers as ``load_state_dict``
        does (which checks what they hold)."""
        received: Dict[str, torch.Tensor] = {}

        def keep(tensors: Dict[str, torch.Tensor]) -> None:  # views of a reused buffer
            received.update({name: tensor.clone() for name, tensor in tensors.items()})

        wrong = unheld(receiver.receive(version, keep), received)
        if wrong:
            raise WeightSyncError(
                f"the broadcast of model version {version} reached the vllm engine without "
                f"{len(wrong)} tensors as the trainer sent them, e.g. {wrong[:3]}"
            )
        self.load_state_dict(received)

    def release(self) -> int:
        raise NotImplementedError(
            "the vllm engine cannot release its weights (mode: colocate is not supported with "
            "engine_type vllm yet)"
        )

    def close(self) -> None:
        """Stop vLLM's processes (its notes on how they ended go to the log only)."""
        logging.getLogger("vllm").setLevel(logging.ERROR)
        self.llm.llm_engine.engine_core.shutdown()


def import_vllm() -> Any:
    """The ``vllm`` package, its loggers in this process writing to this process's log (vLLM
    gives them a handler onto the console when its logger module is first imported)."""
    import vllm
    import vllm.logger  # noqa: F401  (configures the handler now, so it can be taken off)

    _into_our_log()
    return vllm


def _into_our_log() -> None:
    """vLLM's loggers in this process: into this process's log, not onto the console (vLLM
    sets its console handler up again when an engine starts)."""
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.handlers.clear()
    vllm_logger.propagate = True


def _start(**engine_args: Any) -> Any:
    """vLLM's ``LLM`` with ``engine_args``, saying on the console that it is starting. What
    vLLM's processes print goes to ``vllm.log`` beside this process's log file."""
    # Its worker processes are spawned, not forked: this process runs threads (an event
    # loop, Ray's), which a fork would copy mid-flight.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    vllm = import_vllm()
    folder = log_folder()
    where = "" if folder is None else f"; its output: {os.path.join(folder, 'vllm.log')}"
    print(f"Starting the vllm engine for {engine_args['model']}{where} ...", flush=True)
    start = time.monotonic()
    with output_to(os.path.join(folder, "vllm.log")) if folder else contextlib.nullcontext():
        llm = vllm.LLM(**engine_args, disable_log_stats=True)
    _into_our_log()
    print(f"vllm engine ready in {time.monotonic() - start:.0f}s", flush=True)
    return llm


def _sample(completion: Any, prompt: List[int], top_logprobs: int) -> SampleOutput:
    """One vLLM ``CompletionOutput`` as a ``SampleOutput``."""
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vllm ended a sample with finish_reason {completion.finish_reason}")
    tokens = list(completion.token_ids)
    steps = completion.logprobs or []
    out = SampleOutput(
        token_ids=tokens,
        logprobs=[step[token].logprob for step, token in zip(steps, tokens, strict=True)],
        finish_reason=completion.finish_reason,
        prompt_token_ids=list(prompt),
    )
    if top_logprobs:
        out.top_logprobs = [
            [(tid, lp.logprob) for tid, lp in sorted(step.items(), key=lambda kv: kv[1].rank)][
                :top_logprobs
            ]
            for step in steps
        ]
    return out


def _as_stored(
    state: Dict[str, torch.Tensor], dtype: torch.dtype, tied: bool
) -> Dict[str, torch.Tensor]:
    """``state`` in the engine's dtype, contiguous, without what vLLM does not load: the
    output embedding of a model that ties it to the input one (vLLM shares that tensor),
    and a tensor aliasing one already kept."""
    seen, tensors = set(), {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        if key in seen or (tied and name.startswith(TIED_OUTPUT)):
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to(dtype).contiguous()
    return tensors


def _shared_memory_dir() -> Optional[str]:
    """``/dev/shm`` where it is a writable folder (a file there never reaches a disk);
    None: the system's temporary folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def head_dim(model_config: Any) -> int:
    """The dimensions of one attention head (``head_dim``, else hidden size over heads)."""
    return getattr(model_config, "head_dim", None) or (
        model_config.hidden_size // model_config.num_attention_heads
    )


def cpu_kv_cache_bytes(
    model_config: Any, dtype: torch.dtype, max_model_len: int, max_num_seqs: int
) -> int:
    """The KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens, capped at
    ``CPU_KV_SHARE`` of the memory available now (vLLM then runs fewer sequences at once),
    but never below one whole sequence: ``ValueError`` when even that does not fit."""
    import psutil

    layers = model_config.num_hidden_layers
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    per_token = 2 * layers * heads * head_dim(model_config) * torch.finfo(dtype).bits // 8
    one_sequence = per_token * max_model_len
    available = psutil.virtual_memory().available
    if one_sequence > available * CPU_KV_SHARE:
        raise ValueError(
            f"model.max_model_len = {max_model_len}: one sequence's KV cache needs "
            f"{one_sequence / 2**30:.1f} GiB, more than {CPU_KV_SHARE:.0%} of the "
            f"{available / 2**30:.1f} GiB of memory available; lower max_model_len"
        )
    return int(min(per_token * max_model_len * max_num_seqs, available * CPU_KV_SHARE))
