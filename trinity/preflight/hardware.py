"""What a config asks of this machine that it lacks, and the overrides that make it run here.

A config written for another machine (8 GPUs, vLLM, a Ray cluster of several nodes) is read
as written (DESIGN decision 20): every value this machine cannot honour is one line, and one
command line gathers the overrides that make the config start here::

    - cluster.gpu_per_node = 2 but this machine has 0 GPU(s) visible to torch ...
    - explorer.rollout_model.engine_type = vllm: vLLM is not installed ...
    to run it here: trinity run --config x.yaml cluster.gpu_per_node=0 explorer...

``hardware_fixes`` reads one stage as loaded (nothing derived yet: an unset key resolves to
what the machine has, so only values a config sets ask for more) and returns a ``Fix`` per
value: its line, and the override that replaces it. The checks run in order on a copy that
holds the earlier fixes, as one fix changes what the next sees (no GPU left: neither NCCL nor
vLLM's GPU build can run). ``sync_method: nccl`` is no such value: on CPU it broadcasts
over gloo (``common/weights.py``). ``check_before_start`` applies the fixes before its other checks,
so the rest of the config is checked as it would run here; ``finalize`` reports the lines.
What does not depend on this machine (a config's own GPU arithmetic, features not built) is
reported where it is today: ``gpus.py``, ``support.py``.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from trinity.common.config import gpus
from trinity.common.config.config import Config
from trinity.preflight.hosting import ray_reasons
from trinity.preflight.support import show
from trinity.preflight.vllm_checks import INSTALL_CPU, INSTALL_GPU, vllm_build, vllm_models

GPU_KEY = "cluster.gpu_per_node"


@dataclass(frozen=True)
class Machine:
    """What this machine offers a run."""

    gpus: int  # visible to torch
    cluster: bool  # a Ray cluster to join (RAY_ADDRESS, or Ray already connected)
    vllm: Optional[str]  # vLLM's build: cpu, gpu, or None (not installed)

    @classmethod
    def here(cls) -> Machine:
        ray = sys.modules.get("ray")  # importing ray here would fix its node address too early
        joined = bool(os.environ.get("RAY_ADDRESS")) or (ray is not None and ray.is_initialized())
        return cls(gpus.detect_gpu_count(), joined, vllm_build())


@dataclass(frozen=True)
class Fix:
    """A value this machine cannot honour: the line saying so and the override that can."""

    problem: str
    key: str  # dotted as on the command line; list items by index (auxiliary_models.0)
    value: Any

    def override(self, stage: Optional[int] = None) -> str:
        prefix = "" if stage is None else f"stages.{stage}."
        return f"{prefix}{self.key}={show(self.value)}"


def hardware_fixes(
    config: Config, machine: Optional[Machine] = None, gpu_limit: Optional[int] = None
) -> Tuple[Config, List[Fix]]:
    """(a copy of ``config`` with every fix applied, the fixes), in the order found.

    ``gpu_limit``: at most this many GPUs for a stage that asks more than the machine has
    (``fix_stages``: the stages of a run share ``cluster.gpu_per_node``).
    """
    machine = machine or Machine.here()
    fixed, fixes = config.model_copy(deep=True), []
    checks = (_nodes, functools.partial(_gpus, limit=gpu_limit), _vllm)
    for check in checks:
        for fix in check(fixed, machine):
            _apply(fixed, fix.key, fix.value)
            fixes.append(fix)
    return fixed, fixes


def fix_stages(
    stages: Sequence[Config], machine: Optional[Machine] = None
) -> List[Tuple[Config, List[Fix]]]:
    """``hardware_fixes`` of every stage of a run, with one GPU count for them all (the
    most that fits each: a count that fits one stage may not fit another's roles)."""
    machine = machine or Machine.here()
    limit = None
    while True:
        results = [hardware_fixes(stage, machine, limit) for stage in stages]
        counts = {fix.value for _, fixes in results for fix in fixes if fix.key == GPU_KEY}
        if len(counts) <= 1:
            return results
        limit = min(counts)  # each pass lowers it: at 0 (CPUs) every stage fits


def hardware_problems(config: Config) -> List[str]:
    """The lines of ``hardware_fixes`` (what ``finalize`` reports)."""
    return [fix.problem for fix in hardware_fixes(config)[1]]


def _apply(config: Config, key: str, value: Any) -> None:
    """Set ``key`` as a command-line override would (then user-set, like one)."""
    *parents, leaf = key.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    setattr(node, leaf, value)


# ---- the checks, in order ---------------------------------------------------------------


def _nodes(config: Config, machine: Machine) -> List[Fix]:
    nodes = config.cluster.node_num
    if nodes < 2 or machine.cluster:
        return []
    return [
        Fix(
            f"cluster.node_num = {nodes} needs a Ray cluster of {nodes} nodes, but RAY_ADDRESS "
            "is not set, so this run would start a one-node local Ray (for several nodes: "
            "`ray start --head` here, `ray start --address=<head ip>:6379` on the others, "
            "then RAY_ADDRESS=<head ip>:6379)",
            "cluster.node_num",
            1,
        )
    ]


def _gpus(config: Config, machine: Machine, limit: Optional[int] = None) -> List[Fix]:
    """More GPUs than the machine has: the most it has (up to ``limit``) that the stage's
    roles fit on, with fewer engines where they were counted for the missing GPUs; 0 (its
    CPUs) always fits. Engines on GPUs run on one GPU each."""
    asked, seen = config.cluster.gpu_per_node, machine.gpus
    if asked is None or asked <= seen:
        return _one_gpu_engines(config, asked if asked is not None else seen)
    count, fixes = 0, []
    for candidate in range(min(seen, seen if limit is None else limit), 0, -1):
        found = _fit(config, candidate)
        if found is not None:
            count, fixes = candidate, found
            break
    why = "" if seen else " (a CPU-only torch build, or CUDA_VISIBLE_DEVICES empty)"
    line = (
        f"cluster.gpu_per_node = {asked} but this machine has {seen} GPU(s) visible to "
        f"torch{why}; the stage fits on {f'{count} GPU(s)' if count else 'its CPUs'}"
    )
    return [Fix(line, GPU_KEY, count), *fixes]


def _one_gpu_engines(config: Config, count: int) -> List[Fix]:
    if count == 0:  # on CPU tensor_parallel_size is the vllm engine's (``_vllm``)
        return []
    return [
        Fix(
            f"{share.key}.tensor_parallel_size = {share.tensor_parallel_size}: an engine runs "
            "on one GPU here (tensor parallelism is not supported yet)",
            f"{_override_key(share.key)}.tensor_parallel_size",
            1,
        )
        for share in gpus.gpu_shares(config).engines
        if share.tensor_parallel_size > 1
    ]


def _fit(config: Config, count: int) -> Optional[List[Fix]]:
    """The fixes that fit the stage on ``count`` GPUs (engines on one GPU each, fewer rollout
    engines if they take the trainer's), or None where it cannot fit."""
    trial = config.model_copy(deep=True)
    trial.cluster.gpu_per_node = count
    fixes = _one_gpu_engines(trial, count)
    for fix in fixes:
        _apply(trial, fix.key, fix.value)
    shares = gpus.gpu_shares(trial)
    room = count - shares.engine_gpus - shares.trains  # what the engines take too many
    rollout = next((s for s in shares.engines if s.auxiliary is None), None)
    shared = count == 1 or config.mode == "colocate"  # one GPU: every role shares it
    if not shared and room < 0 and rollout is not None and rollout.engine_num + room >= 1:
        engines = rollout.engine_num + room
        line = (
            f"explorer.rollout_model.engine_num = {rollout.engine_num}: {count} GPU(s) hold "
            f"{engines} engine(s){' beside the trainer' if shares.trains else ''}"
        )
        fixes.append(Fix(line, "explorer.rollout_model.engine_num", engines))
        _apply(trial, fixes[-1].key, engines)
    if gpus.gpu_problems(trial) or _one_gpu_needs_ray(trial):
        return None
    return fixes


def _one_gpu_needs_ray(config: Config) -> bool:
    """One GPU that the trainer and the engines would share, in a stage that needs Ray."""
    shares = gpus.gpu_shares(config)
    return (
        shares.total == 1
        and config.mode != "colocate"
        and bool(shares.problems())
        and bool(ray_reasons(config))
    )


def _vllm(config: Config, machine: Machine) -> List[Fix]:
    """vLLM where it is not installed, or built for other devices: the transformers engine;
    its tensor parallelism on CPU: one engine per process."""
    count = config.cluster.gpu_per_node
    on_gpu = (machine.gpus if count is None else count) > 0
    fixes = []
    for path, section, _ in vllm_models(config):
        key, why = _override_key(path), _vllm_missing(machine.vllm, on_gpu)
        if why is not None:
            line = f"{path}.engine_type = vllm: {why}; the transformers engine runs it here"
            fixes.append(Fix(line, f"{key}.engine_type", "transformers"))
        elif section.tensor_parallel_size > 1 and not on_gpu:
            line = (
                f"{path}.tensor_parallel_size = {section.tensor_parallel_size}: tensor "
                "parallelism of the vllm engine on CPU is not supported yet (engine_num adds "
                "engines)"
            )
            fixes.append(Fix(line, f"{key}.tensor_parallel_size", 1))
    return fixes


def _vllm_missing(build: Optional[str], on_gpu: bool) -> Optional[str]:
    """Why vLLM cannot run the stage's engines here, or None."""
    if build is None:
        return f"vLLM is not installed (`{INSTALL_GPU if on_gpu else INSTALL_CPU}`)"
    if (build == "gpu") != on_gpu:
        want, devices = ("GPU", "no GPU") if build == "gpu" else ("CPU", "GPUs")
        return f"vLLM's {want} build is installed, and the stage has {devices}"
    return None


def _override_key(path: str) -> str:
    """``explorer.auxiliary_models[0]`` as an override names it: ``...auxiliary_models.0``."""
    return path.replace("[", ".").replace("]", "")


# ---- the overrides of a run ---------------------------------------------------------------


def stage_overrides(fixes: Sequence[Sequence[Fix]], staged: bool) -> List[str]:
    """The overrides of every stage's fixes: the global form where each stage has the same
    fix (a global override reaches every stage), ``stages.N.`` where they differ."""
    if not staged:
        return [fix.override() for fix in fixes[0]]
    shared = set.intersection(*({fix.override() for fix in stage} for stage in fixes))
    found = [fix.override() for fix in fixes[0] if fix.override() in shared]
    for index, stage in enumerate(fixes):
        found += [fix.override(index) for fix in stage if fix.override() not in shared]
    return found


def run_command(
    config_path: str, plugin_dirs: Sequence[str], overrides: Sequence[str], fixes: Sequence[str]
) -> str:
    """``trinity run`` of ``config_path`` with the user's overrides, less those a fix
    replaces: followed by the fixes, the command that starts the config here."""
    replaced = {fix.partition("=")[0] for fix in fixes}
    kept = [o for o in overrides if o.partition("=")[0].strip() not in replaced]
    words = ["trinity", "run", "--config", config_path]
    for folder in plugin_dirs:
        words += ["--plugin-dir", folder]
    return " ".join(shlex.quote(word) for word in [*words, *kept])
