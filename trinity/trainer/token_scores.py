"""Logprob of each target token and entropy of its distribution, from logits or from the
hidden states before the output head.

``token_scores`` scores logits that already exist. ``head_scores`` starts one step earlier,
from the final hidden states and the output head's weight, and applies the head a chunk of
tokens at a time: each chunk's fp32 scores (tokens x vocabulary) live only while that chunk
is scored, in forward and again in backward, and for backward only the chunks' logits in the
head's compute dtype are kept, up to ``HEAD_KEEP_ELEMENTS`` (the rest are recomputed). With
a 152k vocabulary fp32 logits are 0.6 MB per token, several times the whole model's
activations; the softmax tensors autograd would keep for backward are as large again.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# Logits (rows x tokens x vocabulary) above which they are scored in chunks of rows, each
# recomputed in backward: with a 152k vocabulary the fp32 softmax tensors a pass keeps for
# backward are several times the logits themselves (57 GB at 8k tokens on an H100).
CHUNK_ELEMENTS = 2**28

# Logits elements (tokens x vocabulary) ``head_scores`` computes at once: 64 MB in fp32, a
# few such tensors alive per chunk in backward; 341 tokens of SmolLM2's 49k vocabulary, 110
# of a 152k one, which still keeps a GPU's matrix products large.
HEAD_CHUNK_ELEMENTS = 2**24

# Logits elements whose chunks ``head_scores`` keeps for backward, in the head's compute
# dtype (256 MB in bf16), instead of recomputing them there: one head product in four saved
# for a fifth of the memory the full-logits path keeps. Beyond this budget (a GPU
# micro-batch of 8k tokens x 152k is 1.2G) chunks are recomputed.
HEAD_KEEP_ELEMENTS = 2**27


def token_scores(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool = True
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Logprobs (B, R) of ``targets`` (B, R) under ``logits / temperature`` (B, R, V), and
    the entropy (B, R) of that distribution when asked. Large logits are scored in chunks
    of rows, which only changes peak memory."""
    rows, tokens, vocab = logits.shape
    per_chunk = max(1, CHUNK_ELEMENTS // max(1, tokens * vocab))
    if rows <= per_chunk:
        return _scores(logits, targets, temperature, with_entropy)
    recompute = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for start in range(0, rows, per_chunk):
        args = (logits[start : start + per_chunk], targets[start : start + per_chunk])
        if recompute:
            parts.append(checkpoint(_scores, *args, temperature, with_entropy, use_reentrant=False))
        else:
            parts.append(_scores(*args, temperature, with_entropy))
    logprob = torch.cat([p[0] for p in parts])
    return logprob, torch.cat([p[1] for p in parts]) if with_entropy else None


def _scores(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    log_probs = _log_softmax(logits, max(temperature, 1e-6))
    logprob = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    return logprob, entropy


def head_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool = True,
    compute_dtype: Optional[torch.dtype] = None,
    chunk_tokens: Optional[int] = None,
    scored: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``token_scores`` of the logits ``hidden @ weight.T + bias``, never all of them at once.

    hidden: (..., H) final hidden states; weight: (V, H) output head (possibly tied to the
    input embedding: its gradient is added like any other); bias: (V,) or None; targets:
    (...) token ids; scored: (...) bool, the tokens to score (default: all), e.g. a batch's
    real response tokens: the others (padding) cost no head work and get logprob and entropy
    0 and no gradient. Returns logprobs (...) and, when asked, entropies (...), in fp32. The
    head's product runs in ``compute_dtype`` (default: ``weight``'s), as ``nn.Linear`` under
    autocast to that dtype would, and the softmax in fp32. ``chunk_tokens`` tokens are
    scored at a time (default: ``HEAD_CHUNK_ELEMENTS // V``); the values and gradients (to
    ``hidden``, ``weight`` and ``bias``) are those of scoring the full logits.
    """
    lead = targets.shape
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    index = None
    if scored is not None and not bool(scored.all()):
        index = scored.reshape(-1).nonzero().squeeze(1)
        flat_hidden, flat_targets = flat_hidden.index_select(0, index), flat_targets[index]
    chunk = chunk_tokens or max(1, HEAD_CHUNK_ELEMENTS // weight.shape[0])
    training = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    keep = HEAD_KEEP_ELEMENTS // weight.shape[0] if training else 0  # tokens
    logprob, entropy = _HeadScores.apply(
        flat_hidden,
        weight,
        bias,
        flat_targets,
        max(temperature, 1e-6),
        with_entropy,
        compute_dtype or weight.dtype,
        chunk,
        keep,
    )
    if index is not None:  # back in place among the unscored tokens' zeros
        tokens = targets.numel()
        logprob = logprob.new_zeros(tokens).index_copy(0, index, logprob)
        if with_entropy:
            entropy = entropy.new_zeros(tokens).index_copy(0, index, entropy)
    return logprob.view(lead), entropy.view(lead) if with_entropy else None


def _head(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], dtype: torch.dtype
) -> torch.Tensor:
    """(n, V) logits of ``hidden`` (n, H) in ``dtype`` (``weight``/``bias`` already in it),
    as the plain head under autocast to ``dtype`` gives them."""
    return F.linear(hidden.to(dtype), weight, bias)


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(n, V) fp32 ``log_softmax(logits / temperature)``, ``logits`` left as they are."""
    z = logits.float()
    if temperature != 1.0:
        z = z.div_(temperature) if z is not logits else z / temperature
    return z.log_softmax(dim=-1)


class _HeadScores(torch.autograd.Function):
    """Chunked scoring with a hand-written backward: ``hidden``, the head, the entropy and
    log-normaliser (logsumexp of the tempered logits) per token, and the first ``keep``
    tokens' logits in ``dtype`` are kept; the other chunks' logits are recomputed.

    On CPU a chunk's (n, V) passes are bound by memory, so backward makes as few as it can:
    log p from the kept normaliser in one pass from the logits (no second log-softmax), p,
    the gradient written once in ``dtype``; the weight's gradient is one product over the
    chunks kept (one cast to fp32), not one per chunk."""

    @staticmethod
    def forward(
        ctx: Any, hidden, weight, bias, targets, temperature, with_entropy, dtype, chunk, keep
    ):
        # Explicit casts, not autocast: the same products in forward and in backward.
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            logprob = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
            entropy = torch.empty_like(logprob) if with_entropy else logprob.new_empty(0)
            norm = torch.empty_like(logprob)  # logsumexp of each token's tempered logits
            kept = []  # the logits of the first chunks, up to ``keep`` tokens
            for s in range(0, hidden.shape[0], chunk):
                part = slice(s, s + chunk)
                logits = _head(hidden[part], w, b, dtype)
                if min(s + chunk, hidden.shape[0]) <= keep:
                    kept.append(logits)
                log_p = _log_softmax(logits, temperature)  # (n, V) fp32
                logprob[part] = log_p.gather(-1, targets[part, None]).squeeze(-1)
                # log p = z - logsumexp(z) for any column; the first one gives the normaliser
                norm[part] = logits[:, 0].float() / temperature - log_p[:, 0]
                if with_entropy:
                    p = log_p.exp()
                    entropy[part] = -torch.linalg.vecdot(p, log_p)
        ctx.save_for_backward(hidden, weight, bias, targets, entropy, norm, *kept)
        ctx.settings = (temperature, with_entropy, dtype, chunk)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx: Any, g_logprob: torch.Tensor, g_entropy: Optional[torch.Tensor]):
        hidden, weight, bias, targets, entropy, norm, *kept = ctx.saved_tensors
        temperature, with_entropy, dtype, chunk = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if not (with_entropy and g_entropy is not None):
            g_entropy = None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            grad_h = torch.empty_like(hidden) if need_h else None
            # Summed over chunks in fp32, cast to the parameters' dtypes once at the end.
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
            grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
            h_all = hidden.to(dtype)
            held = sum(len(k) for k in kept)  # the kept chunks' gradients, multiplied at once
            g_held = h_all.new_empty(held, weight.shape[0]) if held else None
            for i, s in enumerate(range(0, hidden.shape[0], chunk)):
                part = slice(s, s + chunk)
                logits = kept[i] if i < len(kept) else _head(h_all[part], w, b, dtype)
                out = g_held[part] if i < len(kept) else None
                g_logits = _chunk_grad(
                    logits,
                    norm[part],
                    targets[part],
                    g_logprob[part],
                    None if g_entropy is None else g_entropy[part],
                    entropy[part],
                    temperature,
                    out,
                )
                if grad_h is not None:
                    grad_h[part] = g_logits @ w
                if grad_w is not None and i >= len(kept):
                    grad_w.add_(g_logits.t() @ h_all[part])
                if grad_b is not None:
                    grad_b += g_logits.sum(0).float()
            if grad_w is not None and held:
                grad_w.add_(g_held.t() @ h_all[:held])
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _chunk_grad(
    logits: torch.Tensor,
    norm: torch.Tensor,
    targets: torch.Tensor,
    g_logprob: torch.Tensor,
    g_entropy: Optional[torch.Tensor],
    entropy: torch.Tensor,
    temperature: float,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Gradient (n, V) w.r.t. a chunk's logits (n, V), in their dtype (into ``out`` when
    given), from the log-normalisers ``norm`` (n,) of ``z = logits / temperature``, targets
    (n,), upstream gradients (n,) and entropies (n,). With log p = z - norm, d log p_t / dz
    = onehot(t) - p and dH / dz = -p * (log p + H), the sum is onehot(t) * g_logprob - p *
    (g_logprob + g_entropy * (log p + H)), divided by the temperature for the logits."""
    rows = torch.arange(len(targets), device=targets.device)
    log_p = torch.add(-norm[:, None], logits, alpha=1.0 / temperature)  # (n, V) fp32
    p = log_p.exp()
    if g_entropy is None:
        scale = (g_logprob / -temperature)[:, None]
    else:  # -(g_logprob + g_entropy * (log p + H)) / T, in place of log p
        shift = (g_logprob + g_entropy * entropy)[:, None]
        scale = log_p.mul_(g_entropy[:, None]).add_(shift).div_(-temperature)
    # The target's entry in fp32 before the one rounding to the logits' dtype: its two terms
    # nearly cancel where p_t is near 1.
    target = (p[rows, targets] * scale.expand_as(p)[rows, targets]) + g_logprob / temperature
    if out is None:
        out = torch.empty_like(logits)
    torch.mul(p, scale, out=out)
    out[rows, targets] = target.to(out.dtype)
    return out
