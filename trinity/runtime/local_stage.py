"""A stage on one node runs in the launcher's own process: no Ray, no actors.

The roles are the same plain objects a Ray stage hosts in actors: ``TrainerRole``,
``ExplorerRole`` (its engines as ``LocalEngine``s, its runners as threads), the experience
queue (``QueueHost``), the synchronizer (on an event loop of its own, ``LoopHost``) and the
status board. Each role runs in a thread named after it while the main thread prints
progress; what a role's threads log goes to its file under ``log/``, as from an actor.

Run in-process a stage starts in seconds (no Ray to start, no process per role importing
torch again) and holds one process's memory instead of Ray's dozen. What it gives up: a
task that outlives ``explorer.max_timeout`` is abandoned, not killed (its thread runs on),
and a workflow that kills its process ends the run. ``cluster.in_process: false`` runs every
stage on Ray; so do stages that need it (``trinity/preflight/hosting.py: runs_in_process``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from trinity.runtime.failures import RunFailed, failure_message
from trinity.runtime.roles import RoleLogs
from trinity.utils import openmp
from trinity.utils.status import RunStatus

logger = logging.getLogger(__name__)


def run_in_process(
    config: Any, plugin_dirs: List[str], printer: Any, steps: int
) -> Tuple[Optional[str], Dict[str, Any]]:
    """Run the stage here, printing progress as a Ray stage does: (the trainer's final HF
    export, what each role's ``run`` returned)."""
    stage = _LocalStage(config, plugin_dirs)
    try:
        with _role_logs(config):
            start = stage.start_roles(steps)
            printer.begin_stage(config, steps, start)
            stage.run(lambda: printer.poll(stage.status.snapshot(printer.events_seen)))
    finally:
        printer.end_stage()
        stage.stop()
    trainer = stage.roles.get("trainer")
    return (trainer.final_hf_dir() if trainer is not None else None), stage.outputs


class _LocalStage:
    """The roles of one stage as objects of this process, each role in its own thread."""

    def __init__(self, config: Any, plugin_dirs: List[str]) -> None:
        import torch

        from trinity.runtime.launcher import stage_queue
        from trinity.runtime.queue_host import QueueHost
        from trinity.runtime.roles import compute_threads
        from trinity.runtime.synchronizer import Synchronizer
        from trinity.utils.loop_host import LoopHost

        self.config, self.plugin_dirs = config, plugin_dirs
        # The roles share this process's torch threads: as many as each compute role gets
        # on Ray (every core when trainer and engines take turns, else a share).
        torch.set_num_threads(
            compute_threads(config, "engine" if config.mode in ("explore", "bench") else "trainer")
        )
        # A `both` stage's trainer and engines take turns on the cores: each hands its OpenMP
        # workers back when its turn ends, or libgomp throttles them all (utils/openmp.py).
        openmp.share_cores(config.mode in ("both", "colocate"))
        self.status = RunStatus()
        sync = config.synchronizer
        # A train stage here trains on files: it publishes no weights, no one waits for them.
        self.sync = None
        if config.mode != "train":
            self.sync = LoopHost(
                lambda: Synchronizer(
                    sync.sync_method,
                    config.checkpoint_job_dir,
                    sync.sync_timeout,
                    config.mode in ("both", "colocate", "serve"),
                ),
                "synchronizer",
            )
        self.queue = stage_queue(config, QueueHost)
        self.roles: Dict[str, Any] = {}  # "trainer" / "explorer" -> the role object
        self.outputs: Dict[str, Any] = {}  # role -> what its run() returned

    def start_roles(self, steps: int) -> int:
        """Build and prepare the roles (each in a thread of its name); the resume step."""
        from trinity.runtime.explorer_role import ExplorerRole
        from trinity.runtime.serve_role import ServeRole
        from trinity.runtime.trainer_role import TrainerRole

        cfg, start = self.config, 0
        args = (cfg, self.plugin_dirs, self.queue, self.sync)
        if cfg.mode in ("both", "colocate", "explore", "bench", "serve"):

            def explorer() -> Any:
                role = (ServeRole if cfg.mode == "serve" else ExplorerRole)(*args, self.status)
                role.start_engines()
                return role

            self.roles["explorer"] = self._in_thread("explorer", explorer)
        if cfg.mode in ("both", "colocate", "train", "serve"):
            trainer = self._in_thread("trainer", lambda: TrainerRole(*args, steps, self.status))
            self.roles["trainer"] = trainer
            start = self._in_thread("trainer", trainer.prepare)
        if "explorer" in self.roles:
            explored = self._in_thread("explorer", lambda: self.roles["explorer"].prepare(start))
            start = start if "trainer" in self.roles else explored
        return start

    def _in_thread(self, role: str, work: Callable[[], Any]) -> Any:
        """``work()`` in a thread named after ``role`` (its log records go to the role's
        file); a failure is logged there and raised as the role's ``RunFailed``."""
        outcome: Dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = work()
            except BaseException as exc:
                logger.exception("the %s failed to prepare", role)
                outcome["error"] = exc

        thread = threading.Thread(target=target, name=self._thread_name(role), daemon=True)
        thread.start()
        thread.join()
        if "error" in outcome:
            raise RunFailed(failure_message(outcome["error"], role, self.config)) from None
        return outcome["value"]

    def _thread_name(self, role: str) -> str:
        return self.config.trainer.name if role == "trainer" else self.config.explorer.name

    def run(self, poll: Callable[[], None]) -> None:
        """Run every role to its end, ``poll``ing once a second; the first failure (in the
        order the roles failed) raised as its role's ``RunFailed``."""
        failures: List[Tuple[str, BaseException]] = []
        threads = [
            threading.Thread(
                target=self._run_role, args=(role, failures), name=self._thread_name(role)
            )
            for role in self.roles
        ]
        for thread in threads:
            thread.daemon = True  # a role stuck after another failed never holds the exit
            thread.start()
        while any(t.is_alive() for t in threads) and not self._stops(failures, threads):
            next(t for t in threads if t.is_alive()).join(timeout=1.0)
            poll()
        poll()
        if failures:
            role, error = failures[0]
            raise RunFailed(failure_message(error, role, self.config)) from None

    def _stops(self, failures: List[Tuple[str, BaseException]], threads: List[Any]) -> bool:
        """Whether the stage stops for a failure (``launcher.serves_on``)."""
        from trinity.runtime.launcher import serves_on

        server = [t for role, t in zip(self.roles, threads, strict=True) if role == "explorer"]
        running = bool(server) and server[0].is_alive()
        return bool(failures) and not serves_on(self.config, failures[0][0], running)

    def _run_role(self, role: str, failures: List[Tuple[str, BaseException]]) -> None:
        try:
            self.outputs[role] = self.roles[role].run()  # logs its own failure to its log
        except BaseException as exc:  # reported by the launcher's thread
            failures.append((role, exc))

    def stop(self) -> None:
        openmp.share_cores(False)
        explorer = self.roles.get("explorer")
        if explorer is not None and hasattr(explorer, "pool"):
            explorer.close()
        if self.sync is not None:
            self.sync.close(wait=False)


@contextlib.contextmanager
def _role_logs(config: Any) -> Iterator[None]:
    """While the roles run here, what they log, warn or draw as a progress bar goes to their
    log files (``RoleLogs`` on the root logger; each role's ``setup_process`` adds its file),
    as it would from actors: the console shows the stage's own progress only."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, hf_logging.is_progress_bar_enabled())
    router = RoleLogs(config.trainer.name if config.mode == "train" else config.explorer.name)
    root.handlers = [router]
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
        router.close()
