"""``trinity run``: validate every stage, start (or join) Ray, run the stages in order.

A stage is one wiring of the components for its ``mode``; each stage after the first starts
from the previous stage's final weights (its HF export). Before a stage runs, its folder is
read (``stage_folder.py``): trained from other starting weights, it is moved aside and the
stage starts fresh; holding all the stage's steps, the stage is said to be finished and not
run again; past them, the run stops with a line saying what to do.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from trinity.common.weights import latest_step
from trinity.runtime.failures import RunFailed, failure_message
from trinity.runtime.gpu_bundles import check_gpu_count, release_gpus, reserve_gpus
from trinity.runtime.interrupt import RunInterrupted, stopped_message
from trinity.runtime.placement import (
    Placement,
    alive_nodes,
    check_node_count,
    pinned,
)
from trinity.runtime.progress import ProgressPrinter, eval_summary
from trinity.runtime.stage_folder import finished_weights, prepare_folder, weights_origin
from trinity.runtime.stage_outputs import export_timeline, final_export, plot_stage

if TYPE_CHECKING:
    from trinity.common.config.loader import ConfigSource

# Where Ray logs that the cluster it starts uses token authentication, and how that begins.
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"

# When trainer rank 0 fails, how long to look for another rank's failure that caused it.
RANK_FAILURE_WAIT_S = 2.0


@dataclass
class StageResult:
    name: str
    job_dir: str
    final_hf: Optional[str]
    evals: Dict[str, tuple] = field(default_factory=dict)  # metric -> (first, last)
    bench: Optional[List[Dict]] = None  # mode bench: one metrics record per checkpoint
    already_finished: bool = False  # its folder held all its steps: it did not run again


@dataclass
class RunResult:
    """Where a run's outputs are (``trinity.run`` returns it): each stage's, in order."""

    stages: List[StageResult]

    @property
    def job_dir(self) -> str:
        """The last stage's folder: resolved config, checkpoints, metrics, logs, plots."""
        return self.stages[-1].job_dir

    @property
    def final_hf(self) -> Optional[str]:
        """The last stage's final weights as a Hugging Face folder (None if not exported)."""
        return self.stages[-1].final_hf


def init_ray(namespace: str) -> None:
    """Join ``RAY_ADDRESS`` if set, else start a local Ray (no ``ray start`` needed).

    A local Ray listens on loopback only (docs/design-notes.md, "Principles"): Ray's
    single-node switch makes every Ray process take 127.0.0.1 as the node address, which its
    servers bind to. It must be set before ``ray`` is imported, and child processes inherit
    it. Without ``RAY_ADDRESS`` the run never joins a cluster ``ray start`` left on this
    machine (Ray's own default would): joining one is asked for explicitly
    (``RAY_ADDRESS=auto`` does).
    """
    address = os.environ.get("RAY_ADDRESS") or None
    if address is None:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    logging.getLogger(RAY_AUTH_LOGGER).addFilter(_drop_token_notice)
    ray.init(
        address=address or "local",
        namespace=namespace,
        include_dashboard=False,
        log_to_driver=False,  # actors log to <job_dir>/log/; the driver prints progress
        configure_logging=False,
    )


def _drop_token_notice(record: logging.LogRecord) -> bool:
    """Ray warns on the console, at every start, that it enabled token authentication for the
    local cluster (its default, which the run keeps: design notes, "Loopback"); to a user who
    never started Ray it reads like a problem, so that one notice is dropped."""
    return not record.getMessage().startswith(RAY_TOKEN_NOTICE)


def run_stage(
    config: Any, plugin_dirs: List[str], printer: ProgressPrinter, steps: int
) -> StageResult:
    """Run one stage's roles to the end (``steps``: its planned steps), in this process when
    it needs no other (``local_stage.py``), else on Ray; any failure becomes one
    ``RunFailed`` message."""
    from trinity.common.config import save_resolved_config
    from trinity.preflight.decoupled import resolved_config_name
    from trinity.preflight.hosting import runs_in_process
    from trinity.runtime.local_stage import run_in_process

    job_dir = config.checkpoint_job_dir
    os.makedirs(job_dir, exist_ok=True)
    # A bench of a run, or one side of a decoupled run, keeps the run's own config.yaml.
    save_resolved_config(config, os.path.join(job_dir, resolved_config_name(config)))
    printer.new_board()
    run = run_in_process if runs_in_process(config) else _run_on_ray
    final_hf, outputs = run(config, plugin_dirs, printer, steps)
    if config.mode == "bench":  # a later stage's step 0 is this run's final export
        return StageResult(
            config.name, job_dir, final_export(job_dir), bench=outputs.get("explorer")
        )
    return StageResult(config.name, job_dir, final_hf, eval_summary(job_dir))


def _run_on_ray(
    config: Any, plugin_dirs: List[str], printer: ProgressPrinter, steps: int
) -> Tuple[Optional[str], Dict[str, Any]]:
    """The stage's roles as Ray actors: (the trainer's final HF export, what each role's
    ``run`` returned)."""
    import ray

    job_dir = config.checkpoint_job_dir
    stage = _Stage(config, plugin_dirs)
    try:
        start = stage.start_roles(steps)
        printer.begin_stage(config, steps, start)
        running = list(stage.roles)
        while running:
            done, running = ray.wait(running, num_returns=1, timeout=1.0)
            printer.poll(stage.snapshot(printer.events_seen))
            for ref in done:
                stage.check(ref)
        printer.poll(stage.snapshot(printer.events_seen))
        final_hf = stage.final_hf()
    except ray.exceptions.RayError as exc:
        printer.poll(stage.snapshot(printer.events_seen))
        raise RunFailed(failure_message(exc, stage.failed_role(), config)) from None
    finally:
        printer.end_stage()
        if config.monitor.enable_ray_timeline:  # what each actor ran when, for chrome://tracing
            export_timeline(os.path.join(job_dir, "monitor", "timeline.json"), len(stage.roles))
        stage.stop()
    return final_hf, stage.outputs


class _Stage:
    """The actors of one stage: status board, synchronizer, queue, trainer, explorer."""

    def __init__(self, config: Any, plugin_dirs: List[str]) -> None:
        import ray

        from trinity.runtime.actors import StatusActor
        from trinity.runtime.synchronizer import Synchronizer

        self.config, self.plugin_dirs = config, plugin_dirs
        # cluster.node_num >= 2: the trainer and the engines on nodes of their own
        self.placement = (
            Placement.plan(config, alive_nodes()) if config.cluster.node_num >= 2 else Placement()
        )
        # GPUs: each role's own, reserved before any actor starts (gpu_bundles.py)
        self.placement = replace(self.placement, gpus=reserve_gpus(config))
        sync_cfg = config.synchronizer
        self.status = StatusActor.remote()
        self.sync = ray.remote(num_cpus=0)(Synchronizer).remote(
            sync_cfg.sync_method,
            config.checkpoint_job_dir,
            sync_cfg.sync_timeout,
            has_trainer=config.mode in ("both", "colocate", "serve"),
        )
        from trinity.runtime.actors import QueueActor

        self.queue = stage_queue(config, QueueActor.remote)
        self.trainer = self.explorer = None
        self.ranks: List[Any] = []  # trainer ranks 1..N-1 (trainer.cpu_ranks > 1)
        self.roles: Dict[Any, str] = {}  # run() ref -> role
        self.preparing: Optional[str] = None  # the role whose prepare() is running
        self.failing: Optional[str] = None  # the role whose run() raised
        self.outputs: Dict[str, Any] = {}  # role -> what its run() returned
        self.finished: set = set()  # roles whose run() ended
        self.deferred: Optional[Tuple[str, Exception]] = None  # the first failure: serves_on

    def start_roles(self, steps: int) -> int:
        """Create and prepare the trainer, then the explorer; start both; the resume step."""
        import ray

        from trinity.engine.external import external_env
        from trinity.engine.tinker_service import service_env
        from trinity.monitor import monitor_env
        from trinity.runtime.actors import ExplorerActor, ServeActor, TrainerActor
        from trinity.runtime.roles import launch_env
        from trinity.utils.access import passed_on

        cfg, start = self.config, 0
        # WANDB_MODE, MLFLOW_... of this shell, and the Tinker service's URL and key
        # (TINKER_*) for a Tinker run's trainer and engines, wherever they run
        tracker = monitor_env(cfg.monitor.monitor_type)
        tracker.update(service_env() if cfg.model.tinker.enable else {})
        if cfg.mode in ("both", "colocate", "explore", "bench", "serve"):
            # An external model's URL and key, and the key of the servers the explorer binds
            # (explorer.api_server.api_key_env), from this environment wherever it runs.
            env = {**tracker, **external_env(cfg), **passed_on(cfg.explorer.api_server.api_key_env)}
            role = ServeActor if cfg.mode == "serve" else ExplorerActor
            self.explorer = role.options(
                runtime_env={"env_vars": {**env, **launch_env()}},
                **pinned(self.placement.explorer_node),
            ).remote(cfg, self.plugin_dirs, self.queue, self.sync, self.status, self.placement)
            # Engines and runners start while the trainer prepares: processes start together.
            engines_up = self.explorer.start_engines.remote()
        if cfg.mode in ("both", "colocate", "train", "serve"):
            self.preparing = "trainer"
            self.trainer = TrainerActor.options(
                runtime_env={"env_vars": {**tracker, **launch_env()}},
                **self.placement.options(cfg.trainer.name, self.placement.trainer_node),
            ).remote(cfg, self.plugin_dirs, self.queue, self.sync, steps, self.status)
            start = self._prepare_trainer(steps)
        if self.explorer is not None:
            self.preparing = "explorer"
            ray.get(engines_up)
            explored = ray.get(self.explorer.prepare.remote(start))
            start = start if self.trainer is not None else explored
        self.preparing = None
        for role, actor in (("trainer", self.trainer), ("explorer", self.explorer)):
            if actor is not None:
                self.roles[actor.run.remote()] = role
        for rank, actor in enumerate(self.ranks, start=1):
            self.roles[actor.run.remote()] = f"trainer rank {rank}"
        return start

    def _prepare_trainer(self, steps: int) -> int:
        """Prepare the trainer, with its other ranks when there are several (they form one
        process group, so they prepare together); the step it resumes after. A rank that
        fails is named as the failed role."""
        import ray

        from trinity.runtime.trainer_ranks import start_ranks

        if self.config.trainer.cpu_ranks > 1:  # rank 0 picks the group's port first
            where = ray.get(self.trainer.rendezvous.remote())
            self.ranks = start_ranks(self.config, self.plugin_dirs, steps, where)
        refs = {self.trainer.prepare.remote(): "trainer"}
        for rank, actor in enumerate(self.ranks, start=1):
            refs[actor.prepare.remote()] = f"trainer rank {rank}"
        pending = list(refs)
        while pending:  # the first failure ends the wait (the others may hang on it)
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except ray.exceptions.RayError:
                self.preparing = refs[done[0]]
                raise
        return ray.get(next(iter(refs)))

    def snapshot(self, seen: int) -> Any:
        import ray

        return ray.get(self.status.snapshot.remote(seen))

    def final_hf(self) -> Optional[str]:
        import ray

        return ray.get(self.trainer.final_hf_dir.remote()) if self.trainer is not None else None

    def check(self, ref: Any) -> None:
        """Keep what a finished role returned; raise the first failure, remembering its
        role, once the stage stops for it (``serves_on``)."""
        import ray

        role = self.roles[ref]
        self.finished.add(role)
        try:
            self.outputs[role] = ray.get(ref)
        except ray.exceptions.RayError as exc:
            self.deferred = self.deferred or self._first_cause(ref, exc)
        server_running = "explorer" not in self.finished
        if self.deferred and not serves_on(self.config, self.deferred[0], server_running):
            self.failing, cause = self.deferred
            raise cause from None

    def _first_cause(self, ref: Any, exc: Exception) -> tuple:
        """(role, error) to report: when rank 0 of several trainer ranks fails, a rank that
        failed too is the likelier cause (rank 0's collectives fail when a rank dies)."""
        import ray

        others = [r for r, role in self.roles.items() if role.startswith("trainer rank ")]
        if self.roles[ref] != "trainer" or not others:
            return self.roles[ref], exc
        done, _ = ray.wait(others, num_returns=len(others), timeout=RANK_FAILURE_WAIT_S)
        for other in done:
            try:
                ray.get(other)
            except ray.exceptions.RayError as rank_exc:
                return self.roles[other], rank_exc
        return self.roles[ref], exc

    def failed_role(self) -> str:
        """The role an error came from: the one being prepared, or whose run raised."""
        return self.preparing or self.failing or "stage"

    def stop(self) -> None:
        import ray

        for actor in (self.explorer, self.trainer, *self.ranks, self.queue, self.sync, self.status):
            if actor is not None:
                ray.kill(actor, no_restart=True)
        release_gpus(self.placement.gpus)  # the next stage reserves its own


def serves_on(config: Any, failed_role: str, server_running: bool) -> bool:
    """Whether the stage goes on after ``failed_role`` failed: in mode serve the endpoint
    tells clients of a trainer failure (503) before it stops (``serve_role.py``), so the
    stage waits for the server, then reports the trainer's failure."""
    return config.mode == "serve" and failed_role != "explorer" and server_running


def stage_queue(config: Any, host: Callable[..., Any]) -> Any:
    """The experience queue of a stage the explorer writes to, or of a train stage reading
    what a separate explore run writes (None when it trains on files): ``host(...)`` with
    ``QueueHost``'s arguments (``QueueActor.remote``, or ``QueueHost`` in one process).

    On resume (same job dir) it puts back what train steps after the trainer's checkpoint
    consumed: their updates were lost with the process, so they are trained on again, once.
    """
    from trinity.preflight.decoupled import reads_explorer_store

    # train mode: the store a separate explore run writes (preflight/decoupled.py), or files
    follow = reads_explorer_store(config)
    if config.mode not in ("both", "colocate", "explore", "serve") and not follow:
        return None
    from trinity.buffer.store import buffer_database

    job_dir, storage = config.checkpoint_job_dir, config.buffer.trainer_input.experience_buffer
    # The user's path (a SQLite file or any database URL) if given, else a file in the job
    # dir; the table is the buffer's name.
    database = buffer_database(storage, job_dir)
    rewind_to = (latest_step(job_dir) or 0) if config.mode != "explore" else None
    replay = storage.replay_buffer if storage.replay_buffer.enable else None
    return host(
        database,
        storage.name,
        rewind_to=rewind_to,
        replay=replay,
        follow=follow,
        serving=config.mode == "serve",
    )


def run(
    config: ConfigSource,
    overrides: Sequence[str],
    plugin_dirs: Sequence[str],
) -> List[StageResult]:
    """Everything ``trinity run`` does, for a YAML file or its sections as a dict (``config``);
    config errors surface before Ray starts."""
    from trinity.common.config import apply_run_name, read_config
    from trinity.utils.plugin_loader import load_plugins
    from trinity.utils.startup_gc import paused_until_started

    with paused_until_started() as started:
        load_plugins(list(plugin_dirs))
        # Read without torch: a file that cannot be read at all is refused before the
        # checks import the registries (and torch with them).
        root, problems, unread = read_config(config, overrides)
        root = apply_run_name(root)
        # Every stage finalized and checked (models, data, names, arguments, what this
        # machine lacks) in one pass, on what of the config could be read: all problems in
        # one ConfigError before anything starts.
        stages = _checked(root, config, overrides, plugin_dirs, problems, unread)
        for line in root.ignored_synchronizer():
            logging.getLogger("trinity.config").warning("%s", line)
        started()
        running: List[Any] = []  # the stage that runs now, for the message if stopped
        try:
            return _run_stages(stages, list(plugin_dirs), running)
        except KeyboardInterrupt:
            if not running:
                raise
            # an in-process stage's threads run on until the process ends, logging the errors
            # their stopped peers cause: only the message below is news
            logging.disable(logging.CRITICAL)
            several = len(root.stages) > 1
            text = stopped_message(running[-1], root.name, root.continue_from_checkpoint, several)
            raise RunInterrupted(text) from None


def _checked(
    root: Any,
    config: ConfigSource,
    overrides: Sequence[str],
    plugin_dirs: Sequence[str],
    problems: Sequence[str],
    unread: Sequence[str],
) -> List[Any]:
    """``check_before_start`` with what reading found (``problems``, ``unread``); its error
    names the whole command that runs the config here when the machine lacks what it asks
    (``preflight/hardware.py``)."""
    from trinity.common.config import ConfigError
    from trinity.common.config.loader import env_folder_defaults
    from trinity.preflight.before_start import check_before_start
    from trinity.preflight.hardware import run_command

    try:
        folders = env_folder_defaults(config, overrides)
        return check_before_start(root, problems=problems, unread=unread, env_folders=folders)
    except ConfigError as exc:
        if not exc.overrides or isinstance(config, Mapping):  # a dict: no command to name
            raise
        command = run_command(os.fspath(config), plugin_dirs, overrides, exc.overrides)
        raise ConfigError(
            exc.problems, exc.header, exc.overrides, command, exc.incomplete
        ) from None


def _run_stages(stages: List[Any], plugin_dirs: List[str], running: List[Any]) -> List[StageResult]:
    """The checked stages in order, each from the previous one's final model; ``running``
    gets each stage as it starts."""
    from trinity.preflight.derive import planned_steps
    from trinity.preflight.hosting import runs_in_process

    printer = ProgressPrinter()
    results: List[StageResult] = []
    ray_started = False
    for stage in stages:
        _start_from_previous(stage, results, printer)
        steps = planned_steps(stage)  # rows come from the reader's cache the checks filled
        finished = _already_finished(stage, steps, printer)
        if finished is not None:  # nothing left to run: said, not redone
            results.append(finished)
            continue
        if not ray_started and not runs_in_process(stage):  # with the first stage needing it
            init_ray(stages[0].ray_namespace)
            check_node_count(stages)  # every stage's node count, once
            check_gpu_count(stages)  # and whether a node has each stage's GPUs
            ray_started = True
        running.append(stage)
        results.append(run_stage(stage, plugin_dirs, printer, steps))
        plot_stage(results[-1].job_dir)
    ran = [r for r in results if not r.already_finished]
    if ran:
        printer.summary(ran)
    return results


def _start_from_previous(stage: Any, results: List[StageResult], printer: ProgressPrinter) -> None:
    """Point ``stage`` at the previous stage's final weights, and ready its folder for them:
    moved aside when it was trained from other weights (``stage_folder.py``)."""
    origin = None
    if results and results[-1].final_hf:
        stage.model.model_path = results[-1].final_hf
        origin = weights_origin(results[-1].job_dir)
    prepare_folder(stage, origin, lambda text: printer.console.print(text, markup=False))


def _already_finished(stage: Any, steps: int, printer: ProgressPrinter) -> Optional[StageResult]:
    """The result of a stage whose folder already holds its ``steps``, said in one line;
    None when it has steps to run (``RunFailed`` when its folder is past them)."""
    final = finished_weights(stage, steps)
    if final is None:
        return None
    printer.console.print(
        f"[bold]stage {stage.name}[/bold]: already finished (step {steps} of {steps}); "
        f"final weights (HF): {final}"
    )
    job_dir = stage.checkpoint_job_dir
    return StageResult(stage.name, job_dir, final, eval_summary(job_dir), already_finished=True)
