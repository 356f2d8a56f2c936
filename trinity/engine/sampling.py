"""Vectorised next-token sampling: every row of a batch has its own settings.

The functions at the top are pure functions of tensors, shaped ``(B, V)`` for logits
(``B`` running rows, ``V`` vocabulary) and ``(B,)`` for per-row settings. ``RowSampler``
holds those per-row settings for a running batch, so one decoding step costs a handful of
batched kernels no matter how many rows or how many distinct ``SamplingParams``.

A row samples by inverting its distribution's CDF at one uniform draw
(``inverse_cdf_sample``); a request with a ``seed`` of its own samples by the exponential
race (``sample_tokens``) with noise from its own generator, so its samples do not depend on
what runs beside it. The race needs a uniform draw per vocabulary entry, which on CPU cost
more than the rest of sampling together (docs/performance.md, "Sampling").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from trinity.common.models.sampling import SamplingParams


def effective_temperature(temperature: torch.Tensor) -> torch.Tensor:
    """Temperature used for scaling: ``T`` where ``T > 0``, else 1 (greedy rows).

    Shapes: ``temperature`` (B,) -> (B,).
    """
    return torch.where(temperature > 0, temperature, torch.ones_like(temperature))


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """Penalise tokens already in the sequence: positive logits divided, negative multiplied.

    Shapes: ``logits`` (B, V) float, ``seen`` (B, V) bool -> (B, V). ``penalty > 1`` makes
    repeats less likely (the CTRL-paper rule that ``transformers`` and vLLM also use).
    """
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus (top-p) set to ``-inf``.

    Shapes: ``logits`` (B, V), ``top_k`` (B,) long (``<= 0`` = no limit), ``top_p`` (B,)
    float in (0, 1] -> (B, V). Top-k is applied first, then top-p on the renormalised
    remainder; the most likely token always survives.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    remove = ranks[None, :] >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly more likely tokens
    remove = remove | (mass_before >= top_p[:, None])
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample_tokens(
    logits: torch.Tensor, greedy: torch.Tensor, noise: torch.Tensor | None
) -> torch.Tensor:
    """Pick one token per row: argmax for greedy rows, a sample from softmax(logits) otherwise.

    Shapes: ``logits`` (B, V) (already temperature-scaled and filtered), ``greedy`` (B,)
    bool, ``noise`` (B, V) i.i.d. Exponential(1) draws (``None`` if every row is greedy)
    -> (B,) long. ``argmax(p / E)`` with ``E ~ Exp(1)`` selects token ``i`` with probability
    ``p_i`` (the exponential race), which needs no per-row ``multinomial`` call and lets
    callers supply reproducible noise per row.
    """
    best = logits.argmax(dim=-1)
    if noise is None:
        return best
    sampled = (logits.softmax(dim=-1) / noise).argmax(dim=-1)
    return torch.where(greedy, best, sampled)


def inverse_cdf_sample(
    weights: torch.Tensor, uniform: torch.Tensor, block: int = 256
) -> torch.Tensor:
    """Pick token ``i`` of each row with probability ``weights_i / sum(weights)``.

    Shapes: ``weights`` (B, V) float, non-negative, each row with some positive entry (e.g.
    ``exp(scores - max)``, 0 for excluded tokens), ``uniform`` (B,) float64 in [0, 1) ->
    (B,) long. Returns the first token whose running sum of weights exceeds ``uniform``
    times the row's total: never a token of weight 0. The running sum is taken in two
    levels, so that a float32 sum over a 150k vocabulary does not blur small weights: blocks
    of ``block`` tokens are chosen by their masses summed in float64, then the token within
    its block by a float32 running sum of at most ``block`` terms.
    """
    rows, vocab = weights.shape
    if vocab % block:
        weights = F.pad(weights, (0, -vocab % block))
    blocks = weights.view(rows, -1, block)  # (B, N, K)
    ends = blocks.sum(dim=-1).double().cumsum(dim=-1)  # (B, N) mass up to each block's end
    total = ends[:, -1:]
    below = torch.nextafter(total, torch.zeros_like(total))  # u * total may round up to it
    target = torch.minimum(uniform[:, None] * total, below)  # (B, 1)
    chosen = torch.searchsorted(ends, target, right=True)  # (B, 1): first end above target
    before = F.pad(ends, (1, 0))[:, :-1].gather(1, chosen)  # at most target, by the search
    left = (target - before).float()
    # the chosen block's running sum only: (B, K)
    in_block = blocks[torch.arange(rows, device=weights.device), chosen.squeeze(1)].cumsum(dim=-1)
    # the float64 difference may round to the block's float32 total or above it
    left = torch.minimum(left, torch.nextafter(in_block[:, -1:], torch.zeros_like(left)))
    index = torch.searchsorted(in_block, left, right=True)
    return (chosen * block + index).squeeze(1)


def drop_tokens(
    weights: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``weights`` = ``exp(scores - row max)`` with tokens ``(rows[i], ids[i])`` excluded, in
    place: what masking those scores to ``-inf`` and exponentiating again gives, bit for bit.

    Shapes: ``weights``, ``scores`` (B, V) float; ``rows``, ``ids`` (N,) long -> (B, V). A
    row keeps its max, and so its weights, unless an excluded token held it (weight 1): such
    rows are exponentiated again from their remaining scores, whose weights may otherwise
    all have underflowed to 0.
    """
    held_max = weights[rows, ids] == 1
    weights[rows, ids] = 0
    redo = rows[held_max].unique()
    if len(redo):  # unique's size: a host sync on a GPU, at steps min_tokens holds only
        part = scores[redo]
        inside = torch.isin(rows, redo)
        part[torch.searchsorted(redo, rows[inside]), ids[inside]] = float("-inf")
        weights[redo] = (part - part.amax(dim=-1, keepdim=True)).exp_()
    return weights


def exponential_noise(
    shape: Tuple[int, ...], generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """I.i.d. Exponential(1) draws as ``-log(U)``, U ~ Uniform(0, 1).

    On CPU this is ~5x faster than ``Tensor.exponential_`` (36 vs 192 us for 128 x 100;
    docs/performance.md). ``torch.rand`` can return exactly 0 (probability 2^-24 per
    draw): it is clamped to the smallest normal float, a draw of 87 instead of infinity.
    """
    uniform = torch.rand(shape, generator=generator, device=device)
    return uniform.clamp_(min=torch.finfo(uniform.dtype).tiny).log_().neg_()


@dataclass
class _SeededRows:
    generator: torch.Generator  # noise source of one request's rows only
    owner: int  # the request's id in ``RowSampler.owner``
    n: int


_ROW_TENSORS = (
    "out",
    "owner",
    "nth",
    "steps",
    "temperature",
    "top_p",
    "top_k",
    "min_tokens",
    "max_tokens",
    "stop_ids",
)


@dataclass
class RowSampler:
    """Sampling settings, limits and progress of each running row (one row per sample).

    Built from requests' ``SamplingParams`` (with ``max_tokens`` and ``min_tokens`` already
    resolved); ``join`` appends the rows of requests that arrive while others decode,
    ``select`` keeps the rows still running. Each row counts its own steps, so a row's
    limits and its seeded noise do not depend on when it joined.
    """

    out: torch.Tensor  # (B,) long: the output row each running row writes to
    owner: torch.Tensor  # (B,) long: the id of the request the row samples for
    nth: torch.Tensor  # (B,) long: which of its request's ``n`` samples the row is
    steps: torch.Tensor  # (B,) long: tokens the row has sampled so far
    temperature: torch.Tensor  # (B,) float
    top_p: torch.Tensor  # (B,) float
    top_k: torch.Tensor  # (B,) long
    min_tokens: torch.Tensor  # (B,) long
    max_tokens: torch.Tensor  # (B,) long
    stop_ids: torch.Tensor  # (B, S) long, eos + stop_token_ids, padded with -1
    seen: Optional[torch.Tensor]  # (B, V) bool tokens so far; only with a repetition penalty
    repetition_penalty: float
    seeded: List[_SeededRows]
    # Batch-wide facts decided on the host, so decoding steps need no device syncs.
    any_filter: bool  # some row uses top-k or top-p
    any_sampled: bool  # some row has temperature > 0
    any_greedy: bool  # some row has temperature 0
    unit_temperature: bool  # every row's temperature is 0 or 1: logits are not divided
    suppress_steps: int  # stop ids may be masked (min_tokens) for this many more steps
    top_logprobs: int  # largest top_logprobs asked for: that many alternatives per step

    @classmethod
    def build(
        cls,
        params: List[SamplingParams],
        owners: List[int],
        out: torch.Tensor,
        eos_ids: List[int],
        repetition_penalty: float,
        seen: Optional[torch.Tensor],
    ) -> RowSampler:
        """Rows for ``params`` in order, ``params[i].n`` consecutive rows each, of the
        requests ``owners`` (ids unique among running requests), writing to rows ``out``."""
        device = out.device
        counts = torch.tensor([p.n for p in params])

        def per_row(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).repeat_interleave(counts, dim=0).to(device)

        stops = [sorted(set(eos_ids) | set(p.stop_token_ids or [])) for p in params]
        width = max(1, max(len(s) for s in stops))
        firsts = (counts.cumsum(0) - counts).repeat_interleave(counts)
        return cls(
            out=out,
            owner=per_row(owners, torch.long),
            nth=(torch.arange(int(counts.sum())) - firsts).to(device),
            steps=torch.zeros(len(out), dtype=torch.long, device=device),
            temperature=per_row([p.temperature for p in params], torch.float32),
            top_p=per_row([p.top_p for p in params], torch.float32),
            top_k=per_row([p.top_k for p in params], torch.long),
            min_tokens=per_row([p.min_tokens for p in params], torch.long),
            max_tokens=per_row([p.max_tokens for p in params], torch.long),
            stop_ids=per_row([s + [-1] * (width - len(s)) for s in stops], torch.long),
            seen=seen,
            repetition_penalty=repetition_penalty,
            seeded=[
                _SeededRows(torch.Generator(device=device).manual_seed(p.seed), owner, p.n)
                for p, owner in zip(params, owners, strict=True)
                if p.seed is not None
            ],
            any_filter=any(p.top_k > 0 or p.top_p < 1 for p in params),
            any_sampled=any(p.temperature > 0 for p in params),
            any_greedy=any(p.temperature == 0 for p in params),
            unit_temperature=all(p.temperature in (0, 1) for p in params),
            suppress_steps=max(p.min_tokens for p in params),
            top_logprobs=max(p.top_logprobs for p in params),
        )

    def join(self, other: RowSampler) -> None:
        """Append ``other``'s rows (requests arriving mid-decode) after the running ones."""
        width = max(self.stop_ids.shape[1], other.stop_ids.shape[1])
        for rows in (self, other):
            rows.stop_ids = F.pad(rows.stop_ids, (0, width - rows.stop_ids.shape[1]), value=-1)
        for name in _ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        if self.seen is not None:
            self.seen = torch.cat([self.seen, other.seen])
        self.seeded += other.seeded
        self.any_filter |= other.any_filter
        self.any_sampled |= other.any_sampled
        self.any_greedy |= other.any_greedy
        self.unit_temperature &= other.unit_temperature
        self.suppress_steps = max(self.suppress_steps, other.suppress_steps)
        self.top_logprobs = max(self.top_logprobs, other.top_logprobs)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (a (B',) index tensor), in that order."""
        for name in _ROW_TENSORS:
            setattr(self, name, getattr(self, name)[keep])
        if self.seen is not None:
            self.seen = self.seen[keep]

    def forget(self, owners: List[int]) -> None:
        """Requests ``owners`` are done: their seeded generators draw no more."""
        self.seeded = [rows for rows in self.seeded if rows.owner not in owners]

    def advance(self, tokens: torch.Tensor) -> None:
        """Count the step every running row just sampled, and record the tokens fed back to
        the model (for the repetition penalty)."""
        self.steps = self.steps + 1
        self.suppress_steps = max(0, self.suppress_steps - 1)
        if self.seen is not None:
            self.seen[torch.arange(len(tokens), device=tokens.device), tokens] = True

    def finished(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(stopped, done) per row after sampling ``tokens`` at each row's own step."""
        stopped = (tokens[:, None] == self.stop_ids).any(dim=-1)
        return stopped, stopped | (self.steps + 1 >= self.max_tokens)

    def sample(
        self, logits: torch.Tensor, generator: torch.Generator
    ) -> Tuple[torch.Tensor, torch.Tensor, Optional[Tuple[torch.Tensor, torch.Tensor]]]:
        """One token per row, its logprob under ``log_softmax(logits / T)`` (T=1 if greedy),
        and, when a row asked for ``top_logprobs``, the most likely tokens and their logprobs.

        Shapes: ``logits`` (B, V) -> tokens (B,) long, logprobs (B,) float, top (values (B, K)
        float, ids (B, K) long) or None, K = ``self.top_logprobs``. Logprobs are taken before
        the penalty, min-token mask and top-k/top-p, i.e. from the plain tempered model the
        trainer recomputes.
        """
        logits = logits.float()
        temperature = effective_temperature(self.temperature)[:, None]
        # Dividing by 1 changes no bit: at temperature 1 a (B, V) pass less (0.5 ms of 4 at
        # SmolLM2's vocabulary and 64 rows).
        scaled = logits if self.unit_temperature else logits / temperature
        shift = scaled.amax(dim=-1, keepdim=True)
        weights = (scaled - shift).exp_()  # (B, V): the tempered distribution, unnormalised
        log_z = shift.squeeze(1) + weights.sum(dim=-1).log()  # (B,) log_softmax's normaliser
        scores = scaled  # what the token is drawn from, once penalised, masked and filtered
        if self.seen is not None:
            scores = apply_repetition_penalty(logits, self.seen, self.repetition_penalty)
            scores = scores / temperature
        if self.suppress_steps:  # min_tokens: no eos/stop id yet
            suppress = (self.stop_ids >= 0) & (self.steps < self.min_tokens)[:, None]
            rows = torch.arange(len(logits), device=logits.device)[:, None].expand_as(suppress)
            rows, ids = rows[suppress], self.stop_ids[suppress]
            if scores is scaled and not (self.any_filter or self.any_greedy or self.seeded):
                # Only the inverse CDF reads the distribution (``_pick``): the stop ids'
                # weights are zeroed in place instead of the (B, V) scores copied, masked
                # and exponentiated again; the same tokens, sampling 7.2 -> 4.9 ms a step at
                # SmolLM2's 64 rows.
                weights = drop_tokens(weights, scaled, rows, ids)
            else:
                scores = scores.clone() if scores is scaled else scores
                scores[rows, ids] = float("-inf")
        if self.any_filter:
            scores = filter_top_k_top_p(scores, self.top_k, self.top_p)
        if scores is not scaled:
            weights = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
        tokens = self._pick(scores, weights, generator)
        logprobs = scaled.gather(1, tokens[:, None]).squeeze(1) - log_z
        top = None
        if self.top_logprobs:
            values, ids = scaled.topk(self.top_logprobs, dim=-1)
            top = (values - log_z[:, None], ids)
        return tokens, logprobs, top

    def _pick(
        self, scores: torch.Tensor, weights: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """(B,) tokens: greedy rows the argmax of ``scores``, sampled rows by the inverse CDF
        of ``weights`` (``exp`` of ``scores`` up to a shift), a seeded request's rows by the
        exponential race with the request's own noise."""
        greedy = self.temperature == 0
        if not self.any_sampled:
            return scores.argmax(dim=-1)
        uniform = torch.rand(
            len(scores), generator=generator, dtype=torch.float64, device=scores.device
        )
        tokens = inverse_cdf_sample(weights, uniform)
        if self.any_greedy:
            tokens = torch.where(greedy, scores.argmax(dim=-1), tokens)
        for rows in self.seeded:
            # Draw for all n samples at each of the request's steps, so a sample's noise
            # depends only on (seed, sample, step), never on which other rows are running.
            draw = exponential_noise((rows.n, scores.shape[1]), rows.generator, scores.device)
            mine = (self.owner == rows.owner).nonzero().squeeze(1)
            tokens[mine] = sample_tokens(scores[mine], greedy[mine], draw[self.nth[mine]])
        return tokens
