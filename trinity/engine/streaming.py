"""Continuous batching for the transformers engine: requests stream through a fixed number
of row slots.

``DecodeStream`` runs one decode loop over ``max_num_seqs`` slots. Requests queue with
``add``; each ``step`` first prefills the queued requests that fit in the free slots (their
distinct prompts once each, a request's ``n`` samples sharing that prefill) and joins their
rows to the running batch (``join`` of the decoders in ``decoding.py``), then samples one
token for every running row and runs the next forward. A request is handed back by the step
at which its last row ends, while other rows keep running, and its slots take the next
queued rows at once. Every row counts its own steps (``RowSampler``), so ``min_tokens``,
``max_tokens`` and a seeded request's noise are those of the request alone: a greedy or
seeded request samples the same tokens whatever runs beside it and whenever it arrives.

A decoder that cannot take rows mid-decode (the static one: its buffers and CUDA graph have
a fixed shape and a shared column) says so with ``joinable = False``; the stream then admits
requests only when no row runs, a batch at a time as before, still handing each request
back as soon as its own rows end.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from trinity.common.models.sampling import SamplingParams
from trinity.engine.sampling import RowSampler

if TYPE_CHECKING:
    from trinity.engine.hf_engine import TransformersEngine

__all__ = ["DecodeStream", "SampleOutput", "fill_from_tail"]


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
class Request:
    """A request as the engine runs it: prompt truncated, limits resolved (``fit``)."""

    prompt: List[int]
    params: SamplingParams


@dataclass
class _Running:
    tag: Any  # the caller's handle, returned with the outputs
    request: Request
    out: List[int]  # the output rows of its n samples, in order
    left: int  # rows still decoding


class DecodeStream:
    """Requests in, each request's samples out as soon as its rows end (module docstring)."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.queue: Deque[Tuple[Any, Request]] = deque()
        self.running: Dict[int, _Running] = {}  # by request id (RowSampler.owner)
        self.rows = 0  # rows decoding now
        self.decoder: Any = None
        self.sampler: Optional[RowSampler] = None
        self.logits: Optional[torch.Tensor] = None  # (rows, V): the next token's
        self.outputs = _Outputs(engine.device, engine.pad_id)
        self.texts = _StopStrings(engine.tokenizer)
        self._ids = itertools.count()

    def add(self, prompt: List[int], params: SamplingParams, tag: Any) -> None:
        """Queue a request; ``fit`` errors (no room in ``max_model_len``) are raised here."""
        self.queue.append((tag, Request(*self.engine.fit(list(prompt), params))))

    def room(self) -> int:
        """Rows that can join now (0 while a decoder that cannot take rows runs)."""
        if self.decoder is not None and not self.decoder.joinable:
            return 0
        return max(0, self.engine.max_num_seqs - self.rows - sum(r.params.n for _, r in self.queue))

    @property
    def busy(self) -> bool:
        return bool(self.running or self.queue)

    def tags(self) -> List[Any]:
        """The handles of every request queued or running."""
        return [tag for tag, _ in self.queue] + [r.tag for r in self.running.values()]

    @torch.inference_mode()
    def step(self) -> List[Tuple[Any, List[SampleOutput]]]:
        """Admit what fits, sample one token per running row, run the next forward; returns
        (tag, samples) of the requests whose last row ended at this step."""
        self._admit()
        if not self.rows:
            return []
        sampler = self.sampler
        tokens, logprobs, best = sampler.sample(self.logits, self.engine._generator)
        self.outputs.write(sampler.out, sampler.steps, tokens, logprobs, best)
        is_stop, done = sampler.finished(tokens)
        hit = self.texts.hits(sampler.out, tokens)
        if hit is not None:
            is_stop, done = is_stop | hit, done | hit
        n_done = int(done.sum())  # the one host sync of a step where no row ends
        finished: List[Tuple[Any, List[SampleOutput]]] = []
        if n_done:
            self.outputs.end(sampler.out[done], sampler.steps[done] + 1, is_stop[done])
            finished = self._finish(sampler.owner[done].tolist())
            if n_done == len(done):
                self.decoder = self.sampler = self.logits = None
                return finished
            # drop finished rows: they would cost a full row of compute each step
            keep = fill_from_tail(done)
            self.decoder.select(keep)
            sampler.select(keep)
            tokens = tokens[keep]
        sampler.advance(tokens)
        self.logits = self.decoder.step(tokens)
        return finished

    def _take(self) -> List[Tuple[Any, Request]]:
        """Queued requests, in order, whose rows fit in the free slots; a request wider than
        every slot runs alone."""
        if self.decoder is not None and not self.decoder.joinable:
            return []
        taken, rows = [], self.rows
        while self.queue:
            n = self.queue[0][1].params.n
            if rows + n > self.engine.max_num_seqs and (rows or taken):
                break
            taken.append(self.queue.popleft())
            rows += n
        return taken

    def _admit(self) -> None:
        if self.queue and self.engine._released is not None:
            raise RuntimeError("the engine's weights are released: load weights first")
        taken = self._take()
        if not taken:
            return
        requests = [r for _, r in taken]
        params = [r.params for r in requests]
        owners = [next(self._ids) for _ in taken]
        out = self.outputs.alloc(
            sum(p.n for p in params),
            max(p.max_tokens for p in params),
            max(p.top_logprobs for p in params),
        )
        first = 0
        for owner, (tag, request) in zip(owners, taken, strict=True):
            rows = out[first : first + request.params.n]
            self.running[owner] = _Running(tag, request, rows, len(rows))
            self.texts.add(rows, request.params.stop)
            first += len(rows)
        ids, mask, source = self.engine._distinct_prompts(requests)
        joining = RowSampler.build(
            params,
            owners,
            torch.tensor(out, device=self.engine.device),
            self.engine.eos_ids,
            self.engine.repetition_penalty,
            self.engine._seen(ids, mask, source),
        )
        if self.decoder is None:
            steps = max(p.max_tokens for p in params)
            self.decoder = self.engine._decoder(ids, mask, source, steps)
            self.sampler, self.logits = joining, self.decoder.logits
        else:
            logits = self.decoder.join(ids, mask, source)
            self.sampler.join(joining)
            self.logits = torch.cat([self.logits, logits])
        self.rows += len(out)

    def _finish(self, owners: List[int]) -> List[Tuple[Any, List[SampleOutput]]]:
        """Count the rows of ``owners`` that ended; hand back the requests left with none."""
        complete = []
        for owner in owners:
            running = self.running[owner]
            running.left -= 1
            if not running.left:
                complete.append(owner)
        self.rows -= len(owners)
        if not complete:
            return []
        done = [self.running.pop(owner) for owner in complete]
        self.sampler.forget(complete)
        rows = [row for running in done for row in running.out]
        self.texts.drop(rows)
        samples = iter(self.outputs.collect(rows))
        results = []
        for running in done:
            group = [next(samples) for _ in running.out]
            for sample in group:
                sample.prompt_token_ids = list(running.request.prompt)
                _cut_top(sample, running.request.params.top_logprobs)
            results.append((running.tag, group))
        return results


def fill_from_tail(done: torch.Tensor) -> torch.Tensor:
    """(B',) the rows to keep when rows ``done`` (B,) bool leave: the first B' rows stay in
    place and the running rows after them move into the finished ones' places, so a KV
    cache copies only those few rows (``GrowingLayer.batch_select_indices``).

    E.g. done = [F, T, F, F, T, F] -> [0, 5, 2, 3]."""
    running = (~done).nonzero().squeeze(1)
    keep = torch.arange(len(running), device=done.device)
    keep[done[: len(running)]] = running[running >= len(running)]
    return keep


def _cut_top(sample: SampleOutput, k: int) -> None:
    """Keep the ``k`` alternatives the sample's request asked for (None when it asked none)."""
    if not k:
        sample.top_logprobs = None
    elif sample.top_logprobs is not None:
        sample.top_logprobs = [step[:k] for step in sample.top_logprobs]


class _Outputs:
    """Each output row's tokens, logprobs, alternatives and end, on the device; rows are
    lent to a request's samples and returned when the request is handed back."""

    def __init__(self, device: torch.device, pad_id: int) -> None:
        self.device, self.pad_id = device, pad_id
        self.free: List[int] = []
        self.tokens = torch.full((0, 0), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((0, 0), dtype=torch.float32, device=device)
        self.top_values = torch.zeros((0, 0, 0), dtype=torch.float32, device=device)
        self.top_ids = torch.zeros((0, 0, 0), dtype=torch.long, device=device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self.stopped = torch.zeros(0, dtype=torch.bool, device=device)

    def alloc(self, count: int, width: int, k: int) -> List[int]:
        """``count`` free rows, each with room for ``width`` tokens and ``k`` alternatives."""
        grow = max(0, count - len(self.free))
        rows, old_width, old_k = len(self.lengths), self.tokens.shape[1], self.top_ids.shape[2]
        width, k = max(width, old_width), max(k, old_k)
        if grow or width > old_width or k > old_k:
            self.tokens = F.pad(self.tokens, (0, width - old_width, 0, grow), value=self.pad_id)
            self.logprobs = F.pad(self.logprobs, (0, width - old_width, 0, grow))
            pad_top = (0, k - old_k, 0, width - old_width, 0, grow)
            self.top_values = F.pad(self.top_values, pad_top)
            self.top_ids = F.pad(self.top_ids, pad_top)
            self.lengths = F.pad(self.lengths, (0, grow))
            self.stopped = F.pad(self.stopped, (0, grow))
            self.free += range(rows, rows + grow)
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def write(self, out, steps, tokens, logprobs, best) -> None:
        """Row ``out[i]``'s token at its step ``steps[i]``, with its logprob (and ``best``:
        the step's top alternatives, when asked)."""
        self.tokens[out, steps] = tokens
        self.logprobs[out, steps] = logprobs
        if best is not None:
            values, ids = best
            k = values.shape[1]
            self.top_values[out, steps, :k] = values
            self.top_ids[out, steps, :k] = ids

    def end(self, out, lengths, stopped) -> None:
        self.lengths[out] = lengths
        self.stopped[out] = stopped

    def collect(self, rows: List[int]) -> List[SampleOutput]:
        """The samples of ``rows`` (one device sync), which go back to the free rows."""
        index = torch.tensor(rows, device=self.device)
        tokens, logprobs = self.tokens[index].tolist(), self.logprobs[index].tolist()
        lengths, stopped = self.lengths[index].tolist(), self.stopped[index].tolist()
        top = None
        if self.top_ids.shape[2]:
            top = (self.top_ids[index].tolist(), self.top_values[index].tolist())
        samples = []
        for i, length in enumerate(lengths):
            samples.append(
                SampleOutput(
                    token_ids=tokens[i][:length],
                    logprobs=logprobs[i][:length],
                    finish_reason="stop" if stopped[i] else "length",
                    top_logprobs=None
                    if top is None
                    else [
                        list(zip(top[0][i][t], top[1][i][t], strict=True)) for t in range(length)
                    ],
                )
            )
        self.free += rows
        return samples


class _StopStrings:
    """Rows whose request has ``stop`` strings: their text is checked after every token.

    Matching decodes each such row's tokens so far (skipping special tokens, as the reply
    text is shown), so it costs a host sync per step, paid only when stop strings are set.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.stops: Dict[int, List[str]] = {}  # by output row
        self.generated: Dict[int, List[int]] = {}

    def add(self, rows: List[int], stop: Optional[List[str]]) -> None:
        for row in rows if stop else []:
            self.stops[row], self.generated[row] = list(stop), []

    def drop(self, rows: List[int]) -> None:
        for row in rows:
            self.stops.pop(row, None)
            self.generated.pop(row, None)

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
