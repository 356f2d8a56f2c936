"""What runs inside vLLM's worker processes: loading new weights and checksumming them.

vLLM builds its workers with this class mixed in (``worker_extension_cls``); the engine
(``vllm_engine.py``) calls its methods through ``LLM.collective_rpc``, on every worker (one per
tensor-parallel rank). Only file paths and numbers cross the process boundary: the weights
themselves go through a safetensors file (in ``/dev/shm`` where there is one), which each worker
maps and reads.

Checksums prove that the engine computes with the weights the trainer sent: after a load,
each worker reports ``(checksum, count)`` of every parameter it holds, the sum of its values'
bit patterns read as integers (exact, so compared for equality, and blind to order, so a
fused parameter holds its parts' sums added up and a kernel's reordering changes nothing),
which ``mismatches`` compares with the same sums of the trainer's tensors. vLLM's CPU backend
hands linear layers' weights to a packed GEMM kernel and empties the parameter, so on CPU the
sums of those layers are taken of the weight at the moment it is packed, which is what the
kernel then computes with.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import torch

from trinity.common.weights import Stats, tensor_stats

# transformers' name of the output embedding, tied to the input one in many small models
# (vLLM then holds one tensor for both)
TIED_OUTPUT = "lm_head."


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


def mismatches(sent: Dict[str, Stats], reports: List[Dict[str, Any]], tied: bool) -> List[str]:
    """The checkpoint names whose values the engine does not hold, from every worker's
    ``trinity_checksums``; an empty list when it holds all of them.

    A parameter fused from several checkpoint tensors holds their sums added up (vLLM's zero
    padding of the vocabulary adds nothing). A parameter split over tensor-parallel ranks
    holds them added over the ranks; one that each rank replicates holds them on every rank.
    """
    packed = reports[0]["packed"]
    targets: Dict[str, List[str]] = {}
    unheld = []
    for name in sent:
        target = _target(name, reports[0]["stats"], packed)
        if target is None:
            if not (tied and name.startswith(TIED_OUTPUT)):
                unheld.append(f"{name} (no such parameter in the engine)")
            continue
        targets.setdefault(target, []).append(name)
    for target, names in targets.items():
        want = sum(sent[n][0] for n in names)
        held = [r["stats"][target][0] for r in reports]
        if want != sum(held) and any(h != want for h in held):
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
