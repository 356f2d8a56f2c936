"""What runs inside vLLM's worker processes: loading new weights and checksumming them.

vLLM builds its workers with this class mixed in (``worker_extension_cls``); the engine
(``vllm_engine.py``) calls its methods through ``LLM.collective_rpc``, on every worker (one per
tensor-parallel rank). Only file paths and numbers cross the process boundary: the weights
themselves go through a safetensors file (in ``/dev/shm`` where there is one), which each worker
maps and reads.

Checksums prove that the engine computes with the weights the trainer sent: after a load,
each worker reports ``(sum, sum of squares, count)`` in float64 of every parameter it holds,
which ``weight_check.py`` compares with the same sums of the trainer's tensors. vLLM's CPU
backend hands linear layers' weights to a packed GEMM kernel and empties the parameter, so on
CPU the sums of those layers are taken of the weight at the moment it is packed, which is
what the kernel then computes with.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import torch

# (sum, sum of squares, number of elements), all float64
Stats = Tuple[float, float, int]


def tensor_stats(tensor: torch.Tensor) -> Stats:
    """``Stats`` of a tensor's values as they are (no dtype conversion before the sums)."""
    values = tensor.detach().reshape(-1).to(torch.float64)
    return float(values.sum()), float(values.square().sum()), values.numel()


class TrinityWorkerExtension:
    """Methods vLLM adds to each of its workers (``self`` is the worker)."""

    def trinity_load(self, path: str) -> None:
        """Load the safetensors file ``path`` (checkpoint names, as the trainer saves them)
        into the running model in place, through vLLM's own reload (it repacks what its
        kernels need)."""
        from safetensors import safe_open

        _watch_packing(self)

        def tensors() -> Iterator[Tuple[str, torch.Tensor]]:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

        self.model_runner.reload_weights(weights_iterator=tensors())

    def trinity_checksums(self) -> Dict[str, Any]:
        """This worker's parameters' ``Stats`` by name, and how checkpoint names map onto
        them (``packed``: vLLM's fused modules, e.g. ``qkv_proj`` from q/k/v)."""
        model = self.model_runner.get_model()
        packed_stats = getattr(self, "_trinity_packed", {})
        stats: Dict[str, Stats] = {}
        for name, param in model.named_parameters():
            if param.numel() == 0 and name in packed_stats:
                stats[name] = packed_stats[name]
            else:
                stats[name] = tensor_stats(param)
        packed = getattr(model, "packed_modules_mapping", None) or {}
        return {"stats": stats, "packed": {k: list(v) for k, v in packed.items()}}


def _watch_packing(worker: Any) -> None:
    """Record the ``Stats`` of each linear weight as vLLM's CPU backend packs it (once per
    worker; a no-op where that backend is not in use)."""
    if hasattr(worker, "_trinity_packed"):
        return
    worker._trinity_packed = {}
    # The linear layers import it from here when they pack (vllm/model_executor/layers/linear.py).
    from vllm.model_executor.layers import utils

    original = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if original is None:
        return
    model = worker.model_runner.get_model()
    names = {id(module): name for name, module in model.named_modules()}

    def recording(layer: torch.nn.Module, remove_weight: bool) -> None:
        name = names.get(id(layer))
        if name is not None and layer.weight.numel():
            worker._trinity_packed[f"{name}.weight"] = tensor_stats(layer.weight)
        original(layer, remove_weight)

    utils.dispatch_cpu_unquantized_gemm = recording


def expected_stats(state: Dict[str, torch.Tensor], dtype: torch.dtype) -> Dict[str, Stats]:
    """The ``Stats`` of the trainer's tensors as the engine holds them (cast to ``dtype``)."""
    return {name: tensor_stats(t.to(dtype)) for name, t in state.items()}


def mismatches(
    sent: Dict[str, Stats], reports: List[Dict[str, Any]], tied: bool, rel: float = 1e-9
) -> List[str]:
    """The checkpoint names whose values the engine does not hold, from every worker's
    ``trinity_checksums``; an empty list when it holds all of them.

    A parameter fused from several checkpoint tensors holds their sums added up (sums and
    sums of squares are additive; vLLM's zero padding of the vocabulary adds nothing). A
    parameter split over tensor-parallel ranks holds them added over the ranks; one that
    each rank replicates holds them on every rank.
    """
    packed = reports[0]["packed"]
    targets: Dict[str, List[str]] = {}
    unheld = []
    for name in sent:
        target = _target(name, reports[0]["stats"], packed)
        if target is None:
            if not (tied and name.startswith("lm_head.")):
                unheld.append(f"{name} (no such parameter in the engine)")
            continue
        targets.setdefault(target, []).append(name)
    for target, names in targets.items():
        want = [sum(sent[n][i] for n in names) for i in (0, 1)]
        held = [r["stats"][target] for r in reports]
        if not _agrees(want, held, rel):
            unheld.extend(names)
    return unheld


def _target(name: str, params: Dict[str, Any], packed: Dict[str, List[str]]) -> Any:
    if name in params:
        return name
    for fused, parts in packed.items():
        for part in parts:
            candidate = name.replace(f".{part}.", f".{fused}.")
            if candidate != name and candidate in params:
                return candidate
    return None


def _agrees(want: List[float], held: List[Stats], rel: float) -> bool:
    # Summation order differs between the two sides: allow rounding relative to the values'
    # size, sqrt(n * sum of squares) >= sum of |x|; a changed element moves the sums far more.
    def close(got: List[float], n: int) -> bool:
        scale = (max(n, 1) * max(want[1], 0.0)) ** 0.5
        return all(abs(g - w) <= rel * scale + 1e-12 for g, w in zip(got, want, strict=True))

    n_total = sum(h[2] for h in held)
    summed = [sum(h[i] for h in held) for i in (0, 1)]
    return close(summed, n_total) or all(close([h[0], h[1]], h[2]) for h in held)
