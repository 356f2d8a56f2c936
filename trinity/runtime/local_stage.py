"""A stage that needs no other process runs in the launcher's own: no Ray, no actors.

That is a ``train`` stage on files (SFT, DPO, ...) with one trainer rank on one node: its
trainer reads no queue and publishes no weights, so it is the ``TrainerRole`` alone. Run
in-process it takes its first step seconds sooner (no Ray to start, no second process to
import torch and transformers into) and holds one process's memory instead of Ray's dozen.
Anything else (an explorer, several ranks or nodes, a cluster named by ``RAY_ADDRESS``, the
Ray timeline) runs on Ray as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Dict, Iterator, List, Optional

from trinity.runtime.failures import RunFailed, failure_message
from trinity.runtime.status import RunStatus

logger = logging.getLogger(__name__)


def runs_in_process(config: Any) -> bool:
    """Whether ``local_stage`` runs this stage (see the module docstring)."""
    from trinity.common.config.decoupled_checks import reads_explorer_store

    return (
        config.mode == "train"
        and config.trainer.cpu_ranks == 1
        and config.cluster.node_num == 1
        and not reads_explorer_store(config)  # a decoupled trainer follows the explorer's store
        and not config.monitor.enable_ray_timeline
        and not os.environ.get("RAY_ADDRESS")  # the user asked for their cluster
    )


def run_in_process(config: Any, plugin_dirs: List[str], printer: Any, steps: int) -> Optional[str]:
    """Train the stage here, printing progress as a Ray stage does; the final HF export."""
    from trinity.runtime.trainer_role import TrainerRole

    status = RunStatus()
    outcome: Dict[str, BaseException] = {}
    try:
        with _logs_to_file():
            role = TrainerRole(config, plugin_dirs, None, None, steps, status)
            start = _prepared(role, config)
            printer.begin_stage(config, steps, start)
            # The role trains in a thread so that this one keeps printing progress and waits.
            worker = threading.Thread(target=_train, args=(role, outcome), daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(timeout=1.0)
                printer.poll(status.snapshot(printer.events_seen))
            printer.poll(status.snapshot(printer.events_seen))
    finally:
        printer.end_stage()
    if "error" in outcome:
        raise RunFailed(failure_message(outcome["error"], "trainer", config)) from None
    return role.final_hf_dir()


@contextlib.contextmanager
def _logs_to_file() -> Iterator[None]:
    """While the role runs here, what it logs, warns or draws as a progress bar goes to its
    log file (the role's ``setup_process`` points the root logger there), as it would from
    an actor: the console shows the stage's own progress only."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, hf_logging.is_progress_bar_enabled())
    hf_logging.disable_progress_bar()
    hf_logging.disable_default_handler()  # transformers' records reach the root logger
    hf_logging.enable_propagation()
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        hf_logging.disable_propagation()
        hf_logging.enable_default_handler()
        if saved[2]:
            hf_logging.enable_progress_bar()
        root.handlers, root.level = saved[0], saved[1]


def _prepared(role: Any, config: Any) -> int:
    """``role.prepare()``, its failure logged to the role's log file and raised as RunFailed."""
    try:
        return role.prepare()
    except Exception as exc:
        logger.exception("the trainer failed to prepare")
        raise RunFailed(failure_message(exc, "trainer", config)) from None


def _train(role: Any, outcome: Dict[str, BaseException]) -> None:
    try:
        role.run()  # logs its own failure to its log file
    except BaseException as exc:  # reported by the launcher's thread
        outcome["error"] = exc
