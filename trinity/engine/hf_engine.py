"""The embedded rollout engine: batched sampling with ``transformers`` and a KV cache.

``TransformersEngine`` is a plain class (the Ray actor wrapping lives elsewhere). Requests
stream through ``max_num_seqs`` row slots (``streaming.py``): each distinct prompt is
prefilled once and its cache shared among its ``n`` samples (``decoding.py``), then one
forward pass per new token runs for the whole running batch. Rows that finish are dropped
and queued requests' rows take their slots at the next step; sampling is vectorised over
rows, so requests with different ``SamplingParams`` share the same forward passes.

Logprobs are those of the sampled tokens under ``log_softmax(logits / T)`` (``T = 1``
for greedy rows), taken before top-k/top-p, repetition penalty and min-token masking:
exactly what the trainer recomputes from the same weights.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from transformers import AutoModelForCausalLM

from trinity.common.adapter_weights import Adapter, peft_adapter
from trinity.common.models.sampling import SamplingParams
from trinity.common.weight_transfer import WeightReceiver, unheld
from trinity.common.weights import WeightSyncError
from trinity.engine.decoding import make_decoder, supports_shared_prefix
from trinity.engine.prompts import PromptSide
from trinity.engine.static_decoding import StaticDecoder, StaticSlots, bucket_rows, static_columns
from trinity.engine.streaming import DecodeStream, Request, SampleOutput
from trinity.ops import packed_linear
from trinity.utils.device import attention_kwargs

__all__ = ["SampleOutput", "SamplingParams", "TransformersEngine"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DECODERS = ("auto", "static", "graphs")


def _set_cpu_threads(num_threads: Optional[int]) -> None:
    """Use ``num_threads`` torch threads; by default honour OMP_NUM_THREADS if someone set
    it (Ray does, from an actor's ``num_cpus``), else use every core this process may run on.

    More threads than free cores is far worse than too few: OpenMP threads waiting on a
    busy core made decoding ~5x slower in our measurements on a shared 2-core machine.
    """
    if num_threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return
        try:
            num_threads = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            num_threads = os.cpu_count() or 1
    torch.set_num_threads(num_threads)


def _folder_adapter(model: torch.nn.Module, path: str) -> Tuple[torch.nn.Module, Adapter]:
    """(``model`` as it was, the LoRA adapter of the peft folder ``path``): peft reads the
    folder (its rank, alpha and targets give each layer's scale), then lets go of the model."""
    from peft import PeftModel

    wrapped = PeftModel.from_pretrained(model, path)
    adapter = peft_adapter(wrapped)
    return wrapped.unload(), adapter


class TransformersEngine(PromptSide):
    """Sample from a local Hugging Face causal LM with batched, KV-cached decoding."""

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
        decoder: str = "auto",
        **prompt_side: Any,
    ) -> None:
        """``prompt_side``: ``PromptSide``'s arguments (the length limits, the chat template,
        the parsers). ``decoder``: ``auto`` (the growing caches of ``decoding.py``), ``static``
        (fixed shapes, ``static_decoding.py``) or ``graphs`` (static, each step a replayed
        CUDA graph; a CUDA device only)."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got '{dtype}'")
        if decoder not in _DECODERS:
            raise ValueError(f"decoder must be one of {_DECODERS}, got '{decoder}'")
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        if device == "cpu":
            _set_cpu_threads(num_threads)
        super().__init__(model_path, **prompt_side)
        self.repetition_penalty = repetition_penalty
        self.max_num_seqs = max_num_seqs
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=_DTYPES[dtype], **attention_kwargs(self.device)
        )
        adapter = None
        if adapter_path is not None:  # a peft LoRA adapter folder, merged over the weights
            self.model, adapter = _folder_adapter(self.model, adapter_path)
        self.model.to(self.device).eval()
        if self.device.type == "cpu":  # oneDNN's layout, made once per weight version
            packed_linear.pack_linears(self.model)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        # One cache copy per distinct prompt where the architecture allows it, on CPU only:
        # there decode attention is bound by reading the cache (1.3x faster, docs/
        # performance.md); on an H100 small models are bound by kernel launches instead,
        # and its extra small kernels made decoding ~1.7x slower than plain SDPA.
        self.shared_prefix = self.device.type == "cpu" and supports_shared_prefix(self.model)
        if decoder != "auto" and not supports_shared_prefix(self.model):
            raise ValueError(
                f"decoder '{decoder}' needs plain full attention in every layer, which "
                f"{type(self.model).__name__} does not have; use decoder 'auto'"
            )
        if decoder == "graphs" and self.device.type != "cuda":
            raise ValueError(f"decoder 'graphs' needs a CUDA device, not '{device}'")
        self.decoder = decoder
        self._slots: Optional[StaticSlots] = None  # the static decoder's buffers and graph
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.eos_ids[0] if self.eos_ids else 0
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._released: Optional[Dict[str, torch.Size]] = None  # name -> shape, see release
        self._base: Dict[str, torch.Tensor] = {}  # adapted weights before any adapter, on CPU
        if adapter is not None:
            self.load_adapter(adapter)

    # ---------------------------------------------------------------- sampling

    def generate(
        self, prompts: List[List[int]], params: List[SamplingParams]
    ) -> List[List[SampleOutput]]:
        """Sample ``params[i].n`` responses to each ``prompts[i]`` (token ids).

        Returns one list per prompt, in order, each with ``params[i].n`` outputs. The
        requests stream through ``max_num_seqs`` slots (``streaming.py``).
        """
        if len(prompts) != len(params):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        if self._released is not None:
            raise RuntimeError("the engine's weights are released: load weights first")
        stream = self.stream()
        for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            stream.add(prompt, p, index)
        results: List[List[SampleOutput]] = [[] for _ in prompts]
        while stream.busy:
            for index, samples in stream.step():
                results[index] = samples
        return results

    def stream(self) -> DecodeStream:
        """A decode loop that requests join while it runs (continuous batching)."""
        return DecodeStream(self)

    def _decoder(self, ids: torch.Tensor, mask: torch.Tensor, source: torch.Tensor, steps: int):
        """Prefill the distinct prompts (P, W) for rows ``source`` (B,) with this engine's
        decoder; a static one reuses the buffers (and CUDA graph) of the last batch shape."""
        if self.decoder == "auto":
            return make_decoder(self.model, ids, mask, source, steps, self.shared_prefix)
        shape = (bucket_rows(len(source)), static_columns(ids.shape[1], steps))
        graphs = self.decoder == "graphs"
        if self._slots is None or not self._slots.fits(*shape, graphs):
            self._slots = None  # the old buffers and graph go before the new ones come
            self._slots = StaticSlots(*shape, self.device, graphs)
        return StaticDecoder(self.model, ids, mask, source, self._slots)

    def _distinct_prompts(
        self, requests: List[Request]
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded distinct prompts: ids and mask (P, W), and the prompt of each output
        row (B,), rows laid out request by request, ``n`` each."""
        distinct: Dict[Tuple[int, ...], int] = {}
        source = []
        for req in requests:
            index = distinct.setdefault(tuple(req.prompt), len(distinct))
            source.extend([index] * req.params.n)
        width = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), width), dtype=torch.long)
        for i, prompt in enumerate(distinct):  # left padding: prompts end at the same column
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device), torch.tensor(source, device=self.device)

    def _seen(
        self, ids: torch.Tensor, mask: torch.Tensor, source: torch.Tensor
    ) -> Optional[torch.Tensor]:
        """(B, V) bool: tokens in each row's prompt, if a repetition penalty needs them."""
        if self.repetition_penalty == 1.0:
            return None
        prompt_ids, prompt_mask = ids[source], mask[source]
        vocab = self.model.get_output_embeddings().weight.shape[0]
        seen = torch.zeros((len(prompt_ids), vocab), dtype=torch.bool, device=self.device)
        real = prompt_mask.bool()  # padding does not count as seen
        rows = torch.arange(len(prompt_ids), device=self.device)[:, None].expand_as(prompt_ids)
        seen[rows[real], prompt_ids[real]] = True
        return seen

    # ----------------------------------------------------------------- weights

    def state_dict_keys(self) -> List[str]:
        """Names the engine accepts in ``load_state_dict`` (the model's state dict keys)."""
        return list(self.model.state_dict().keys())

    def release(self) -> int:
        """Free the weights' memory (``mode: colocate``: the trainer steps meanwhile on the
        same device); the next ``load_state_dict``, which must then hold every weight, brings
        them back. Returns the bytes freed (0 when already released)."""
        if self._released is not None:
            return 0
        self._released, freed = {}, 0
        self._slots = None  # a CUDA graph holds the addresses of the weights freed below
        packed_linear.forget(self.model)
        for name, param in self.model.named_parameters():  # tied weights are listed once
            self._released[name] = param.shape
            freed += param.numel() * param.element_size()
            param.data = param.data.new_empty(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the blocks back for the trainer's allocations
        return freed

    def _restore(self, names: Any) -> None:
        """Allocate released weights again (their values come from the caller's copy)."""
        missing = [name for name in self._released if name not in names]
        if missing:
            raise KeyError(
                f"load_state_dict after release needs every weight; {len(missing)} missing, "
                f"e.g. {missing[:3]}"
            )
        for name, param in self.model.named_parameters():
            param.data = param.data.new_empty(self._released[name])
        self._released = None

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> None:
        """Copy new weights in place (dtype/device converted); a subset of keys is allowed,
        except after ``release``. They are the weights a later adapter merges over.

        Everything is checked before anything is copied, so a bad state dict leaves the
        current weights intact.
        """
        self._copy_in(state_dict)
        self._base = {}

    @torch.no_grad()
    def load_adapter(self, adapter: Adapter) -> None:
        """Merge a LoRA adapter over the base weights (``checkpoint`` sync of a LoRA run).

        Each adapted layer becomes ``W + scale * B @ A`` of its *base* weight ``W``, copied to
        CPU when an adapter first touches it: the next adapter replaces this one rather than
        adding to it. The merge is the trainer's (``Adapter.merged``), so the weights equal
        what its ``memory`` sync would have sent.
        """
        if self._released is not None:
            raise RuntimeError("load_adapter: the weights it merges over are released")
        current = self.model.state_dict()
        unknown = [name for name in adapter.layers if name not in current]
        if unknown:
            raise KeyError(
                f"load_adapter: the adapter adapts {len(unknown)} weight(s) this model lacks, "
                f"e.g. {unknown[:3]}; expected names like {list(current)[:3]}"
            )
        for name in adapter.layers:
            if name not in self._base:
                self._base[name] = current[name].detach().to("cpu", copy=True)
        self._copy_in(adapter.merged(self._base))

    @torch.no_grad()
    def _copy_in(self, state_dict: Dict[str, torch.Tensor]) -> None:
        if self._released is not None:
            self._restore(state_dict.keys())
        current = self.model.state_dict()
        unknown = [k for k in state_dict if k not in current]
        if unknown:
            raise KeyError(
                f"load_state_dict: {len(unknown)} unknown key(s), e.g. {unknown[:3]}; "
                f"expected names like {list(current)[:3]}"
            )
        for name, value in state_dict.items():
            if current[name].shape != value.shape:
                raise ValueError(
                    f"load_state_dict: '{name}' has shape {tuple(value.shape)}, "
                    f"the model expects {tuple(current[name].shape)}"
                )
        for name, value in state_dict.items():
            current[name].copy_(value)

    def receive_weights(self, receiver: WeightReceiver, version: int) -> None:
        """Load model ``version`` bucket by bucket as the trainer broadcasts it
        (``sync_method: nccl``), then compare every tensor with the trainer's checksums:
        ``WeightSyncError`` names those the model does not hold."""
        sums = receiver.receive(version, self.load_state_dict)
        wrong = unheld(sums, self.model.state_dict())
        if wrong:
            raise WeightSyncError(
                f"the transformers engine does not hold {len(wrong)} of the {len(sums)} tensors "
                f"of model version {version} as the trainer sent them, e.g. {wrong[:3]}: its "
                "samples would come from other weights than the trainer's"
            )
