"""What ``mode: serve`` needs (``runtime/serve_role.py``), checked before anything starts.

The trainer trains on what clients rewarded and committed, so the algorithm must learn from
a reward per response through an advantage, with nothing a client cannot send (a teacher, a
greedy baseline, preference pairs, expert data). One engine serves at
``explorer.listen_address:explorer.proxy_port``; that address must be free now.
"""

from __future__ import annotations

import socket
from typing import Any, List

from trinity.algorithm import ALGORITHM_TYPE
from trinity.algorithm.algorithm import PairExperienceModel
from trinity.common.config.base import is_set


def serve_problems(config: Any) -> List[str]:
    """One line per key mode serve cannot run with (none in other modes)."""
    if config.mode != "serve":
        return []
    explorer, problems = config.explorer, _algorithm_problems(config.algorithm)
    if config.buffer.total_steps is None:
        problems.append(
            "buffer.total_steps is required in mode serve: the trainer trains that many steps "
            "on committed episodes, then the run (and its endpoint) stops"
        )
    rollout = explorer.rollout_model
    if rollout.engine_num > 1:
        problems.append(
            f"explorer.rollout_model.engine_num = {rollout.engine_num}: mode serve runs one "
            "engine behind explorer.proxy_port (several are not supported yet); set 1"
        )
    for key in ("openai_api_host", "openai_api_port"):
        if is_set(rollout, key):
            problems.append(
                f"explorer.rollout_model.{key}: mode serve listens at explorer.listen_address "
                "and explorer.proxy_port; set those instead"
            )
    if config.cluster.node_num > 1:
        problems.append(
            f"cluster.node_num = {config.cluster.node_num}: mode serve on several nodes is not "
            "supported yet; set 1"
        )
    if explorer.auxiliary_models:
        problems.append(
            "explorer.auxiliary_models: mode serve starts only the rollout model (auxiliary "
            "models are not supported yet); remove them"
        )
    for kind in ("tasksets", "eval_tasksets"):
        if getattr(config.buffer.explorer_input, kind):
            problems.append(
                f"buffer.explorer_input.{kind}: mode serve runs no tasks, clients send the "
                "requests (evaluation while serving is not supported yet); remove them"
            )
    if config.synchronizer.sync_offset:
        problems.append(
            f"synchronizer.sync_offset = {config.synchronizer.sync_offset}: mode serve has "
            "no explore steps to run ahead; the endpoint loads each version the trainer "
            "publishes (every synchronizer.sync_interval steps); remove it"
        )
    return problems


def _algorithm_problems(algorithm: Any) -> List[str]:
    name = algorithm.algorithm_type
    try:
        cls = ALGORITHM_TYPE.get(name)
    except KeyError:  # reported as an unknown name
        return []
    needs = None
    if not getattr(cls, "use_advantage", True) or cls.schema is PairExperienceModel:
        needs = "trains on given data (SFT rows, preference pairs), not on rewards"
    elif getattr(cls, "use_teacher", False):
        needs = "needs a teacher model (explorer.auxiliary_models), which mode serve does not start"
    elif algorithm.advantage_fn == "remax":
        needs = "needs each prompt's greedy response and its reward, which clients do not send"
    elif algorithm.sample_strategy == "mix":
        needs = "mixes in expert data (sample_strategy mix), not supported yet in mode serve"
    if needs is None:
        return []
    return [
        f"algorithm.algorithm_type = {name}: mode serve trains on the rewards clients post "
        f"(grpo, ppo, rloo, opmd, reinforceplusplus and the other RL algorithms), but {name} "
        f"{needs}"
    ]


def port_problems(config: Any) -> List[str]:
    """The endpoint's address is free now (a port 0 is always)."""
    if config.mode != "serve" or not config.explorer.proxy_port:
        return []
    host, port = config.explorer.listen_address, config.explorer.proxy_port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            return [
                f"explorer.proxy_port = {port}: cannot listen on {host}:{port} "
                f"({exc.strerror or exc}); choose a free port (another process may hold this "
                "one), or 0 for any free one"
            ]
    return []
