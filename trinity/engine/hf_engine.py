"""The embedded rollout engine: batched sampling with ``transformers`` and a KV cache.

``TransformersEngine`` is a plain class (the Ray actor wrapping lives elsewhere). One
``generate`` call prefills every distinct prompt once, shares its cache among its ``n``
samples (``decoding.py``), and then runs one forward pass per new token for the whole
running batch.
Rows that finish are dropped from the batch, and sampling is vectorised over rows, so
requests with different ``SamplingParams`` share the same forward passes.

Logprobs are those of the sampled tokens under ``log_softmax(logits / T)`` (``T = 1``
for greedy rows), taken before top-k/top-p, repetition penalty and min-token masking:
exactly what the trainer recomputes from the same weights.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from transformers import AutoModelForCausalLM

from trinity.common.adapter_weights import Adapter, peft_adapter
from trinity.common.models.sampling import SamplingParams
from trinity.common.weight_transfer import WeightReceiver, unheld
from trinity.common.weights import WeightSyncError
from trinity.engine.decoding import make_decoder, supports_shared_prefix
from trinity.engine.prompts import PromptSide
from trinity.engine.sampling import RowSampler
from trinity.engine.static_decoding import StaticDecoder, StaticSlots, bucket_rows, static_columns
from trinity.utils.device import attention_kwargs

__all__ = ["SampleOutput", "SamplingParams", "TransformersEngine"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DECODERS = ("auto", "static", "graphs")


@dataclass
class SampleOutput:
    """One sampled response; a stop/eos token that ended it is included in ``token_ids``."""

    token_ids: List[int]
    logprobs: List[float]
    finish_reason: str  # "stop" (eos, a stop id or a stop string) | "length" (max_tokens)
    prompt_token_ids: List[int] = field(default_factory=list)  # the prompt used, after truncation
    # per response token, the ``top_logprobs`` most likely (token id, logprob), when asked
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None


@dataclass
class _Request:
    prompt: List[int]  # after truncation
    params: SamplingParams  # with max_tokens/min_tokens resolved


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

        Returns one list per prompt, in order, each with ``params[i].n`` outputs.
        """
        if len(prompts) != len(params):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        if self._released is not None:
            raise RuntimeError("the engine's weights are released: load weights first")
        requests = [_Request(*self.fit(list(x), p)) for x, p in zip(prompts, params, strict=True)]
        results: List[List[SampleOutput]] = []
        for chunk in self._chunks(requests) if requests else []:
            results.extend(self._generate_chunk(chunk))
        return results

    def _chunks(self, requests: List[_Request]) -> List[List[_Request]]:
        """Split requests so a chunk runs at most ``max_num_seqs`` rows (bounds KV memory)."""
        chunks: List[List[_Request]] = [[]]
        rows = 0
        for req in requests:
            if chunks[-1] and rows + req.params.n > self.max_num_seqs:
                chunks.append([])
                rows = 0
            chunks[-1].append(req)
            rows += req.params.n
        return chunks

    @torch.inference_mode()
    def _generate_chunk(self, requests: List[_Request]) -> List[List[SampleOutput]]:
        n_rows = sum(r.params.n for r in requests)
        steps = max(r.params.max_tokens for r in requests)
        tokens = torch.full((n_rows, steps), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((n_rows, steps), dtype=torch.float32, device=self.device)
        lengths = torch.zeros(n_rows, dtype=torch.long, device=self.device)
        stopped = torch.zeros(n_rows, dtype=torch.bool, device=self.device)

        ids, mask, source = self._distinct_prompts(requests)
        decoder = self._decoder(ids, mask, source, steps)
        logits = decoder.logits
        sampler = RowSampler.build(
            [r.params for r in requests],
            self.eos_ids,
            self.repetition_penalty,
            self._seen(ids, mask, source),
            self.device,
        )
        top = _TopBuffer(n_rows, steps, sampler.top_logprobs, self.device)
        texts = _StopStrings(self.tokenizer, requests)
        for t in range(steps):
            tok, lp, best = sampler.sample(logits, t, self._generator)
            tokens[sampler.out, t] = tok
            logprobs[sampler.out, t] = lp
            top.write(sampler.out, t, best)
            is_stop, done = sampler.finished(tok, t)
            hit = texts.hits(sampler.out, tok)
            if hit is not None:
                is_stop, done = is_stop | hit, done | hit
            stopped[sampler.out[is_stop]] = True
            lengths[sampler.out[done]] = t + 1
            n_done = int(done.sum())  # the one host sync per step
            if n_done == len(done):
                break
            if n_done:  # drop finished rows: they would cost a full row of compute each step
                keep = (~done).nonzero().squeeze(1)
                decoder.select(keep)
                sampler.select(keep)
                tok = tok[keep]
            sampler.observe(tok)
            logits = decoder.step(tok)
        outputs = self._collect(requests, tokens, logprobs, lengths, stopped)
        top.attach(requests, outputs)
        return outputs

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
        self, requests: List[_Request]
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

    def _collect(
        self,
        requests: List[_Request],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: torch.Tensor,
        stopped: torch.Tensor,
    ) -> List[List[SampleOutput]]:
        tokens_l, logprobs_l = tokens.tolist(), logprobs.tolist()  # one device sync in total
        lengths_l, stopped_l = lengths.tolist(), stopped.tolist()
        results, first = [], 0
        for req in requests:  # rows are laid out request by request, n rows each
            rows = range(first, first + req.params.n)
            results.append(
                [
                    SampleOutput(
                        token_ids=tokens_l[row][: lengths_l[row]],
                        logprobs=logprobs_l[row][: lengths_l[row]],
                        finish_reason="stop" if stopped_l[row] else "length",
                        prompt_token_ids=list(req.prompt),
                    )
                    for row in rows
                ]
            )
            first += req.params.n
        return results

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


class _TopBuffer:
    """The ``top_logprobs`` alternatives of every row and step, when some request asks."""

    def __init__(self, rows: int, steps: int, k: int, device: torch.device) -> None:
        self.k = k
        if k:
            self.values = torch.zeros((rows, steps, k), dtype=torch.float32, device=device)
            self.ids = torch.zeros((rows, steps, k), dtype=torch.long, device=device)

    def write(self, out: torch.Tensor, step: int, best: Any) -> None:
        if best is not None:
            self.values[out, step] = best.values
            self.ids[out, step] = best.indices

    def attach(self, requests: List[_Request], outputs: List[List[SampleOutput]]) -> None:
        """Give each output its rows' alternatives, cut to its request's ``top_logprobs``."""
        if not self.k:
            return
        values, ids = self.values.tolist(), self.ids.tolist()
        row = 0
        for req, group in zip(requests, outputs, strict=True):
            k = req.params.top_logprobs
            for out in group:
                if k:
                    out.top_logprobs = [
                        list(zip(ids[row][t][:k], values[row][t][:k], strict=True))
                        for t in range(len(out.token_ids))
                    ]
                row += 1


class _StopStrings:
    """Rows whose request has ``stop`` strings: their text is checked after every token.

    Matching decodes each such row's tokens so far (skipping special tokens, as the reply
    text is shown), so it costs a host sync per step, paid only when stop strings are set.
    """

    def __init__(self, tokenizer: Any, requests: List[_Request]) -> None:
        self.tokenizer = tokenizer
        self.stops: Dict[int, List[str]] = {}
        first = 0
        for req in requests:
            for row in range(first, first + req.params.n):
                if req.params.stop:
                    self.stops[row] = list(req.params.stop)
            first += req.params.n
        self.generated: Dict[int, List[int]] = {row: [] for row in self.stops}

    def hits(self, out: torch.Tensor, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        """(B,) bool: running rows whose text now contains one of their stop strings."""
        if not self.stops:
            return None
        hit = []
        for row, token in zip(out.tolist(), tokens.tolist(), strict=True):
            if row not in self.stops:
                hit.append(False)
                continue
            self.generated[row].append(token)
            text = self.tokenizer.decode(self.generated[row], skip_special_tokens=True)
            hit.append(any(stop in text for stop in self.stops[row]))
        return torch.tensor(hit, dtype=torch.bool, device=tokens.device)
