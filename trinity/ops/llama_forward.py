"""The rollout engine's forward for Llama-shaped models on CPU, without transformers' modules.

``SharedPrefixDecoder`` calls the model once per decode step. Through transformers that is
the modules' Python (decorators, keyword plumbing, the attention interface's dispatch, the
cache's update calls) and three linears for q, k and v and two for the MLP's gate and up,
each a oneDNN call with a fixed cost of its own. This forward runs the same math, in the
same order and dtypes, from the model's own parameters: q/k/v as one packed matmul and
gate/up as another (their weights concatenated and packed once per weight version, as
``packed_linear`` packs single layers), rotary embeddings on q and k in one pass,
``F.rms_norm`` for the norms (the same fp32 computation as the model's RMSNorm). Logits
are the same bits as transformers' forward (tests/unit/test_llama_forward.py: Llama, Qwen2
and Mistral shapes, fp32 and bf16); SmolLM2-135M's decode step at 1, 8 and 64 rows is
1.19x, 1.16x and 1.06x faster in bf16 (docs/performance.md, "The engine's own forward").

Only models whose every layer is the Llama block run it (``supports``): Llama, Qwen2
(biases on q/k/v) and Mistral without sliding windows, with plain ``nn.Linear``
projections (no adapter layers), SiLU MLPs and RMSNorms of the Llama form. Only calls
without autograd take it (the trainer's passes keep transformers' forward).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from trinity.ops import packed_linear

__all__ = ["LlamaForward", "of", "supports"]

# Model classes whose decoder layers are the Llama block; their norm classes are the
# ``weight * (x / rms(x))`` form computed in fp32 (Gemma's ``1 + weight`` is not).
_MODELS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")
_SILU = ("SiLU", "SiLUActivation")


def _plain_linear(module: Any) -> bool:
    return type(module) is torch.nn.Linear


def _llama_layer(layer: Any) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    projections = [getattr(attn, f"{p}_proj", None) for p in "qkvo"]
    projections += [getattr(mlp, f"{p}_proj", None) for p in ("gate", "up", "down")]
    norms = (
        getattr(layer, "input_layernorm", None),
        getattr(layer, "post_attention_layernorm", None),
    )
    return (
        all(_plain_linear(p) for p in projections)
        and type(getattr(mlp, "act_fn", None)).__name__ in _SILU
        and all(type(n).__name__ in _NORMS for n in norms)
    )


def _full_attention(config: Any) -> bool:
    """Every layer attends to every earlier token (no sliding windows)."""
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        return all(kind == "full_attention" for kind in kinds)
    return getattr(config, "sliding_window", None) is None


def supports(model: Any) -> bool:
    """Whether ``model`` runs ``LlamaForward``: a Llama-shaped causal LM (see the module
    docstring) whose linears ``packed_linear.pack_linears`` packed (the engine's, on CPU)."""
    body = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if type(model).__name__ not in _MODELS or body is None or not _plain_linear(head):
        return False
    return (
        hasattr(head, "_trinity_packed")  # an inference model (the engine's) packed its linears
        and _full_attention(model.config)
        and type(body.norm).__name__ in _NORMS
        and all(_llama_layer(layer) for layer in body.layers)
    )


def _norm(module: Any, x: torch.Tensor) -> torch.Tensor:
    """The Llama RMSNorm: normalised in fp32, cast back, scaled by the weight."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=module.variance_epsilon)
    return module.weight * normed.to(x.dtype)


class _Fused:
    """Linears that read the same input as one packed matmul, ``x -> cat(outputs)``; the
    packed copy is kept on ``owner`` as ``name``, where ``packed_linear.forget`` finds it."""

    def __init__(self, owner: torch.nn.Module, name: str, linears: Sequence[Any]) -> None:
        self.linears = list(linears)  # their weights read at each call: a load may replace them
        self.split = linears[0].out_features
        self.packed = packed_linear.Packed()
        setattr(owner, name, self.packed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights = [linear.weight for linear in self.linears]
        biases = [linear.bias for linear in self.linears]
        return self.packed.linear(x, weights, biases)


class LlamaForward:
    """``model``'s forward, shapes (B, Q) in, logits (B, Q or 1, V) out; see the module
    docstring. ``attend(layer, q, k, v)`` is the attention: q (B, H, Q, D) and this step's
    keys/values (B, Hkv, Q, D) in, (B, Q, H, D) out; it keeps the cache."""

    def __init__(self, model: Any) -> None:
        self.model, self.body = model, model.model
        self.qkv: List[_Fused] = []
        self.gate_up: List[_Fused] = []
        for layer in self.body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            self.qkv.append(_Fused(attn, "_trinity_qkv", qkv))
            self.gate_up.append(_Fused(mlp, "_trinity_gate_up", [mlp.gate_proj, mlp.up_proj]))
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = self.body.layers[0].self_attn.head_dim

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attend: Callable[..., torch.Tensor],
        last_only: bool = False,
    ) -> torch.Tensor:
        x = self.body.embed_tokens(tokens)  # (B, Q, E)
        cos, sin = self.body.rotary_emb(x, positions)  # (B, Q, D)
        cos, sin = cos[:, :, None], sin[:, :, None]
        for i, layer in enumerate(self.body.layers):
            q, k, v = self._qkv(i, _norm(layer.input_layernorm, x), cos, sin)
            out = attend(layer.self_attn, q, k, v)  # (B, Q, H, D)
            x = x + layer.self_attn.o_proj(out.reshape(*x.shape[:2], -1))
            x = x + self._mlp(i, layer.mlp, _norm(layer.post_attention_layernorm, x))
        if last_only:
            x = x[:, -1:]
        return self.model.lm_head(_norm(self.body.norm, x))

    def _qkv(self, i: int, x: torch.Tensor, cos, sin) -> Tuple[torch.Tensor, ...]:
        """q (B, H, Q, D), k and v (B, Hkv, Q, D), q and k rotated (rotary embeddings)."""
        rows, width = x.shape[:2]
        heads, kv = self.heads, self.kv_heads
        qkv = self.qkv[i](x).view(rows, width, heads + 2 * kv, self.head_dim)
        qk = qkv[:, :, : heads + kv]
        half = self.head_dim // 2
        qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
        q, k = qk[:, :, :heads], qk[:, :, heads:]
        return q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, heads + kv :].transpose(1, 2)

    def _mlp(self, i: int, mlp: Any, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up[i](x)
        size = self.gate_up[i].split
        return mlp.down_proj(F.silu(gate_up[..., :size]) * gate_up[..., size:])


def of(model: Any) -> Optional[LlamaForward]:
    """The model's ``LlamaForward``, made once and kept on the model; None where it does not
    apply."""
    own = getattr(model, "_trinity_forward", None)
    if own is None and supports(model):
        own = model._trinity_forward = LlamaForward(model)
    return own
