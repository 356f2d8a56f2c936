"""Trinity GRPO against TRL's ``GRPOTrainer`` on CPU, side by side, from one SFT checkpoint.

What is compared: held-out accuracy bought per second of training. Both systems start from
the same checkpoint, made by the project's own SFT stage (the quickstart's ``sft`` stage run
alone through ``trinity run``), and train GRPO on the quickstart's arithmetic task::

    python bench/grpo_vs_trl.py --preset tiny --steps 150 --eval-interval 25 \\
        --out docs/results/grpo_vs_trl_tiny.json

``--preset smollm2`` compares them on the real model instead: SmolLM2-135M-Instruct as the
instruct model comes (no warm-up), ``examples/smollm2/grpo.yaml``'s word problems, settings
and ``math_verify_reward``, both in bf16 autocast over fp32 weights (``Workload``)::

    python bench/grpo_vs_trl.py --preset smollm2 --steps 100 --eval-interval 25 --target 0.3

How: Trinity runs the quickstart GRPO config (``trinity run`` in a process of its own, as a
user runs it; ``sync_offset`` from ``--sync-offset``, default 0 as in the quickstart); TRL
runs in this process afterwards, never at the same time. Each step both see the same 16 training
questions in the same (file) order, sample 8 answers each (128 completions) scored by the
project's ``math_reward``, and take one AdamW step over all 128 (token-mean loss,
group-normalised advantages, no KL, constant lr). The shared hyperparameters are read from
the quickstart config and handed to TRL, whose optimizer is built by our own
``build_optimizer``, so the update rules agree.

What is timed (evaluation, a greedy pass over the 200 held-out questions, always excluded):
  * ``loop_s``: Trinity from the end of the step-0 eval to the last trainer step (or to the
    start of the final eval, if later: the final weights must reach the explorer); TRL from
    the end of its step-0 eval (in ``on_train_begin``) to the end of the last optimizer step.
    Eval spans inside the window are subtracted. ``samples_per_s = steps * 128 / loop_s``.
  * ``startup_s``: run start to loop start, step-0 eval included (Trinity: the process's
    start and imports, checks, model loads, and Ray's start and actors when the stage runs
    on Ray; TRL: model load and ``GRPOTrainer`` construction, imports excluded). ``wall_s``:
    the whole run.
  * the accuracy curve ``CURVE_FIELDS``, time (eval excluded) to first reach ``--target``,
    and peak memory: of ``trinity run``'s process and its descendants (Ray's processes
    included when it starts Ray), of this process for TRL.

Why it is fair: same weights, data order, prompts, sampling settings, reward code, batch
geometry, optimizer, schedule and clip; eval cost is excluded from both; neither saves
checkpoints inside the loop. Differences that remain are listed in ``CAVEATS`` (and the JSON).
It measures; it asserts nothing. It needs the ``bench`` extra (``pip install -e ".[bench]"``:
TRL, which ``trl_grpo.py`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trinity.preflight.derive import finalize

try:  # imported from the repository root (tests), or run as a script from bench/
    from bench import trl_grpo
except ImportError:
    import trl_grpo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
SMOLLM2_CONFIG = os.path.join(ROOT, "examples", "smollm2", "grpo.yaml")


@dataclass(frozen=True)
class Workload:
    """What both systems train: the config the settings come from, the held-out metric, the
    reward (a registered name both score with) and the compute dtype on CPU."""

    config: str
    metric: str
    reward: str
    bf16: bool


# The tiny presets: the quickstart (its SFT stage makes the start); smollm2: the real model
# of examples/smollm2 as shipped (bf16, no warm-up).
QUICKSTART = Workload(CONFIG, "eval/arithmetic_test/accuracy/mean", "math_reward", False)
SMOLLM2 = Workload(
    SMOLLM2_CONFIG, "eval/word_problems_test/accuracy/mean", "math_verify_reward", True
)


def workload(preset: str) -> Workload:
    return SMOLLM2 if preset == "smollm2" else QUICKSTART


CURVE_FIELDS = ["step", "samples_seen", "wall_s_excluding_eval", "accuracy"]
CAVEATS = [
    "with --sync-offset 1 Trinity explores step s+1 with weights one update old (clipped "
    "importance ratio); TRL is strictly on-policy (ratio 1), as is the default sync_offset 0.",
    "advantage epsilon: ours 1e-6, TRL's fixed 1e-4 (both (r - mean) / (std + eps), unbiased "
    "std over each group of 8).",
    "sampling: Trinity's rollout engine vs TRL's model.generate, both plain temperature "
    "sampling without top-k/top-p; the random streams differ (--seed seeds both: Trinity's "
    "explorer.rollout_model.seed, TRL's seed).",
    "threads: TRL runs all cores in one process; so does Trinity's stage, which runs in "
    "`trinity run`'s process on one machine (its engine and trainer take turns at sync_offset 0).",
    "startup: Trinity's is `trinity run` as a new process (its imports included); TRL's "
    "excludes imports.",
]


class PeakMemory:
    """Peak memory of a process (``pid``; None: this one) and all its descendants, sampled in
    a thread: ``pss_mb`` sums proportional set sizes (a page k processes share counts 1/k in
    each, so libraries every Ray worker maps count once); ``rss_sum_mb`` sums RSS,
    over-counting shared pages."""

    # Reading every process's smaps costs real CPU (a quarter of a core at 0.5 s on this
    # 2-core machine, taken from the Ray workers, which run at a lower priority): sample slowly.
    def __init__(self, interval: float = 5.0, pid: Optional[int] = None) -> None:
        self.pid = pid
        self.interval, self._stop = interval, threading.Event()
        self.peak = {"pss_mb": 0.0, "rss_sum_mb": 0.0, "processes": 0}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.sample()
        self.peak["start_pss_mb"] = self.peak["pss_mb"]  # what the tree held before the run

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs, pss, rss = [root] + root.children(recursive=True), 0, 0
        except psutil.NoSuchProcess:  # the measured process has ended
            return
        for proc in procs:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            pss, rss = pss + info.pss, rss + info.rss
        self.peak["pss_mb"] = max(self.peak["pss_mb"], pss / 2**20)
        self.peak["rss_sum_mb"] = max(self.peak["rss_sum_mb"], rss / 2**20)
        self.peak["processes"] = max(self.peak["processes"], len(procs))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
        self.sample()

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def quickstart_part(workdir: str, name: str, end: str) -> str:
    """Write the quickstart config up to (not including) the last ``end`` as workdir/name."""
    with open(CONFIG) as f:
        text = f.read()
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(text[: text.rindex(end)])
    return path


def config_head(workdir: str, preset: str = "tiny") -> str:
    """The GRPO settings alone: the quickstart config without its stages, or smollm2's."""
    if workload(preset) is SMOLLM2:
        return SMOLLM2_CONFIG
    return quickstart_part(workdir, "grpo.yaml", "\nstages:")


def trinity_run(config: str, overrides: List[str], plugin_dirs: Sequence[str] = ()) -> List[str]:
    """The ``trinity run`` command line, with this interpreter (and so this environment)."""
    plugins = [arg for folder in plugin_dirs for arg in ("--plugin-dir", folder)]
    return [
        sys.executable,
        "-m",
        "trinity.cli.main",
        "run",
        "--config",
        config,
        *plugins,
        *overrides,
    ]


def launch(
    config: str, overrides: List[str], plugin_dirs: Sequence[str] = ()
) -> Tuple[str, Dict, float]:
    """``trinity run`` as a user runs it, in a process of its own (so nothing it leaves in
    memory counts in a later measurement of this process): (its job folder, the peak memory
    of its process tree, wall seconds). The run is named ``<name>_<time>``: a new job folder
    every time."""
    from trinity.common.config import load_config

    cfg = load_config(config, overrides)
    name = f"{cfg.name}_{time.strftime('%Y%m%d_%H%M%S')}"
    overrides = [*overrides, f"name={name}", "continue_from_checkpoint=true"]
    command = trinity_run(config, overrides, plugin_dirs)
    start = time.monotonic()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
        with PeakMemory(pid=process.pid) as memory:
            code = process.wait()
        if code != 0:
            output.seek(0)
            tail = output.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"trinity run exited with {code}:\n{tail}")
    job_dir = os.path.join(ROOT, cfg.checkpoint_root_dir, cfg.project, name)  # run in ROOT
    return job_dir, memory.peak, time.monotonic() - start


def make_sft_checkpoint(args: argparse.Namespace, paths: Dict[str, str]) -> str:
    """Run the quickstart's ``sft`` stage alone (its ``grpo`` stage line dropped); a finished
    run of the same name in the workdir is reused (``continue_from_checkpoint``)."""
    config = quickstart_part(args.workdir, "sft.yaml", "  - stage_name: grpo")
    name = f"sft_{args.preset}_d{args.digits or 'default'}_e{args.sft_epochs or 'default'}"
    name += f"_lr{args.sft_lr}" if args.sft_lr else ""
    overrides = [f"name={name}", f"model.model_path={paths['model_path']}"]
    overrides += [f"checkpoint_root_dir={os.path.join(args.workdir, 'checkpoints')}"]
    overrides += [f"buffer.explorer_input.taskset.path={paths['rl_path']}"]
    overrides += [f"buffer.explorer_input.eval_tasksets.0.path={paths['rl_path']}"]
    overrides += [f"stages.0.buffer.trainer_input.experience_buffer.path={paths['sft_path']}"]
    if args.sft_epochs:
        overrides.append(f"stages.0.buffer.total_epochs={args.sft_epochs}")
    if args.sft_lr:
        overrides.append(f"stages.0.algorithm.optimizer.lr={args.sft_lr}")
    # In a process of its own, as `trinity run` would: what it leaves in memory (a train
    # stage runs in its launcher's process) must not count in this process's measurements.
    command = trinity_run(config, overrides)
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    from trinity.runtime.stage_outputs import final_export

    job_dir = os.path.join(args.workdir, "checkpoints", "quickstart", f"{name}_sft")
    hf = final_export(job_dir)
    if hf is None:
        raise RuntimeError(f"the SFT stage wrote no HF export under {job_dir}")
    return hf


def grpo_overrides(args: argparse.Namespace, checkpoint: str, rl_path: str) -> List[str]:
    """The quickstart GRPO config with our checkpoint, data, step counts and sync offset."""
    overrides = [f"name=grpo_vs_trl_{args.preset}", f"model.model_path={checkpoint}"]
    overrides += [f"checkpoint_root_dir={os.path.join(args.workdir, 'checkpoints')}"]
    overrides += [f"buffer.explorer_input.taskset.path={rl_path}"]
    overrides += [f"buffer.explorer_input.eval_tasksets.0.path={rl_path}"]
    overrides += [f"buffer.total_steps={args.steps}", "explorer.eval_on_startup=true"]
    overrides += [f"explorer.eval_interval={args.eval_interval}"]
    overrides += [f"synchronizer.sync_offset={args.sync_offset}"]
    overrides += [f"explorer.rollout_model.seed={args.seed}"]
    # TRL saves nothing inside its loop; Trinity's final save comes after its loop.
    return overrides + ["trainer.save_interval=0"]


def shared_params(config_path: str, overrides: List[str], args: argparse.Namespace) -> Dict:
    """The hyperparameters both systems use, read from the finalized quickstart config."""
    from trinity.algorithm.optimizer import warmup_steps
    from trinity.common.config import effective_trainer_settings, load_config

    cfg = finalize(load_config(config_path, overrides))
    opt, algo, buf = cfg.algorithm.optimizer, cfg.algorithm, cfg.buffer
    args.optimizer_config = opt  # TRL's AdamW is built from it by our build_optimizer
    if opt.lr_scheduler_type != "constant" or warmup_steps(opt, args.steps) != 0:
        raise SystemExit("only a constant lr without warm-up is mapped onto TRL here")
    if algo.kl_loss_fn not in (None, "none") or algo.kl_penalty_fn not in (None, "none"):
        raise SystemExit("the comparison assumes no KL (TRL beta 0)")
    clip = algo.policy_loss_fn_args
    both = clip.get("clip_range", 0.2)
    low, high = clip.get("clip_range_low") or both, clip.get("clip_range_high") or both
    params = dict(prompts_per_step=buf.batch_size, samples_per_prompt=algo.repeat_times)
    params.update(samples_per_step=buf.batch_size * algo.repeat_times, steps=args.steps)
    params.update(eval_interval=args.eval_interval, target_accuracy=args.target)
    params.update(lr=opt.lr, lr_schedule="constant, no warm-up", betas=list(opt.betas))
    params.update(adam_eps=1e-8, weight_decay=opt.weight_decay, kl="none")
    params.update(grad_clip=effective_trainer_settings(cfg)["grad_clip"])
    params.update(clip_range=[low, high])
    params.update(temperature=buf.explorer_input.taskset.rollout_args.temperature)
    params.update(max_response_tokens=cfg.model.max_response_tokens)
    params.update(max_prompt_tokens=cfg.model.max_prompt_tokens, sync_offset=args.sync_offset)
    params.update(seed=args.seed, reward=workload(args.preset).reward)
    params.update(bf16=workload(args.preset).bf16)
    params.update(loss="token-mean over each step's completions, one optimizer step per step")
    params.update(eval="greedy, at step 0, every eval_interval steps and after the last step")
    return params


def trinity_timeline(
    explorer: List[Dict], trainer: List[Dict], run_start: float, metric: str
) -> Dict:
    """Loop seconds without eval, startup seconds and the accuracy curve, from the records."""
    evals = sorted((r for r in explorer if metric in r), key=lambda r: r["time"])
    spans = [(r["time"] - r.get("time/eval", 0.0), r["time"]) for r in evals]
    trained = [r for r in trainer if "time/train_step" in r]
    steps = max(r["step"] for r in trained)
    if evals and evals[0]["step"] == 0:
        t0 = spans[0][1]
    else:
        t0 = min(r["time"] - r["time/explore_step"] for r in explorer if "time/explore_step" in r)
    end = max(r["time"] for r in trained)
    end = max([end] + [s for (s, _), r in zip(spans, evals, strict=True) if r["step"] == steps])

    def without_eval(t: float) -> float:
        inside = sum(max(0.0, min(e, t) - max(s, t0)) for s, e in spans)
        return max(0.0, t - t0 - inside)

    pairs = zip(spans, evals, strict=True)
    curve = [[r["step"], 0, without_eval(s), r[metric]] for (s, _), r in pairs]
    timing = dict(startup_s=t0 - run_start, loop_s=without_eval(end))
    return dict(steps=steps, **timing, eval_s=sum(e - s for s, e in spans), curve=curve)


def run_trinity(args: argparse.Namespace, checkpoint: str, rl_path: str, params: Dict) -> Dict:
    from trinity.monitor import read_metrics

    overrides = grpo_overrides(args, checkpoint, rl_path)
    run_start = time.time()
    job_dir, peak, wall = launch(config_head(args.workdir, args.preset), overrides)
    logs = [os.path.join(job_dir, "monitor", f"{r}.jsonl") for r in ("explorer", "trainer")]
    metric = workload(args.preset).metric
    timeline = trinity_timeline(*[read_metrics(path) for path in logs], run_start, metric)
    for point in timeline["curve"]:
        point[1] = point[0] * params["samples_per_step"]
    settings = {"sync_offset": args.sync_offset, "job_dir": job_dir}
    return dict(wall_s=wall, **timeline, peak_memory=peak, settings=settings)


def run_trl(args: argparse.Namespace, checkpoint: str, rl_path: str, params: Dict) -> Dict:
    with PeakMemory() as memory:
        result = trl_grpo.train(checkpoint, rl_path, params, args.optimizer_config, args.workdir)
    return dict(result, peak_memory=memory.peak)


def finish(system: Dict, params: Dict) -> Dict:
    """Add samples, samples/s, time to target and first/final accuracy to a system's result."""
    curve = system["curve"]
    system["samples"] = system["steps"] * params["samples_per_step"]
    system["samples_per_s"] = system["samples"] / system["loop_s"] if system["loop_s"] else None
    hit = next((p[2] for p in curve if p[3] >= params["target_accuracy"]), None)
    system.update(time_to_target_s=hit, initial_accuracy=curve[0][3], final_accuracy=curve[-1][3])
    return system


def ratios(systems: Dict[str, Dict]) -> Dict[str, Optional[float]]:
    """Trinity over TRL for samples/s; TRL over Trinity for time to target (>1: we are faster)."""
    ours, theirs = systems.get("trinity"), systems.get("trl")
    if not ours or not theirs:
        return {"samples_per_s": None, "time_to_target": None}
    tt_ours, tt_theirs = ours["time_to_target_s"], theirs["time_to_target_s"]
    return {
        "samples_per_s": ours["samples_per_s"] / theirs["samples_per_s"],
        "time_to_target": tt_theirs / tt_ours if tt_ours and tt_theirs else None,
    }


def _fmt(value: Optional[float], spec: str, missing: str, unit: str) -> str:
    return missing if value is None else format(value, spec) + unit


def _time_to_target(system: Dict, target: float) -> str:
    if system["initial_accuracy"] >= target:  # a zero time would read as a result
        return "reached at start (raise --target)"
    return _fmt(system["time_to_target_s"], ".1f", "never", "s")


def summary_line(report: Dict) -> str:
    target = report["params"]["target_accuracy"]
    parts = [f"grpo_vs_trl {report['preset']} {report['params']['steps']} steps:"]
    for name, s in report["systems"].items():
        parts.append(
            f"{name} {s['samples_per_s']:.1f} samples/s, acc {s['initial_accuracy']:.2f}->"
            f"{s['final_accuracy']:.2f}, to {target}: {_time_to_target(s, target)};"
        )
    r = report["ratios"]
    parts.append(
        f"trinity/trl: samples/s {_fmt(r['samples_per_s'], '.2f', 'n/a', 'x')}, "
        f"time-to-target speed-up {_fmt(r['time_to_target'], '.2f', 'n/a', 'x')}"
    )
    return " ".join(parts)


def plot(report: Dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, system in report["systems"].items():
        xs, ys = [p[2] for p in system["curve"]], [p[3] for p in system["curve"]]
        ax.plot(xs, ys, marker="o", label=f"{name} ({system['samples_per_s']:.0f} samples/s)")
    ax.axhline(report["params"]["target_accuracy"], color="grey", ls="--", lw=1, label="target")
    ax.set_xlabel("training wall time, eval excluded (s)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(f"GRPO on the {report['preset']} model: Trinity vs TRL (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset", default="tiny", help="tiny model preset (tiny, 25m, ...) or smollm2"
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-interval", type=int, default=25)
    parser.add_argument("--target", type=float, default=0.6, help="accuracy for time-to-target")
    parser.add_argument("--sync-offset", type=int, default=0, help="Trinity's sync_offset")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of both systems")
    parser.add_argument("--systems", default="trinity,trl", help="which to run, in order")
    parser.add_argument("--sft-checkpoint", help="HF folder; default: run the SFT stage")
    parser.add_argument("--sft-epochs", type=int, help="SFT epochs (default: the quickstart's)")
    parser.add_argument("--sft-lr", type=float, help="SFT lr (default: the quickstart's)")
    parser.add_argument("--data", help="quickstart folder holding data/rl (needs --sft-checkpoint)")
    parser.add_argument("--digits", type=int, help="operand digits (default: prepare_quickstart's)")
    parser.add_argument("--workdir", help="model, data, checkpoints (default: a temp dir)")
    parser.add_argument("--out", help="JSON path (default docs/results/grpo_vs_trl_PRESET.json)")
    parser.add_argument("--plot", help="PNG path (default: the JSON path with .png)")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.systems or set(args.systems) - {"trinity", "trl"}:
        parser.error("--systems takes trinity, trl or both")
    if args.data and not args.sft_checkpoint:
        parser.error("--data needs --sft-checkpoint (the SFT stage uses the built quickstart)")
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    os.makedirs(args.workdir, exist_ok=True)
    args.out = args.out or os.path.join(ROOT, "docs", "results", f"grpo_vs_trl_{args.preset}.json")
    args.plot = args.plot or os.path.splitext(args.out)[0] + ".png"
    return args


def prepare(args: argparse.Namespace) -> Tuple[str, str]:
    """The SFT checkpoint and the RL data folder (given, or built with ``prepare_quickstart``)."""
    from trinity.demo.synthetic import prepare_quickstart
    from trinity.demo.word_problems import prepare_smollm2

    if args.preset == "smollm2":  # the instruct model as it is: no warm-up
        paths = prepare_smollm2(os.path.join(args.workdir, "smollm2"))
        return paths["model_path"], paths["rl_path"]
    if args.data:
        return os.path.abspath(args.sft_checkpoint), os.path.join(args.data, "data", "rl")
    kwargs = {"digits": args.digits} if args.digits else {}
    root = os.path.join(args.workdir, f"quickstart_{args.preset}_d{args.digits or 'default'}")
    paths = prepare_quickstart(root, preset=args.preset, **kwargs)
    checkpoint = args.sft_checkpoint or make_sft_checkpoint(args, paths)
    return os.path.abspath(checkpoint), paths["rl_path"]


def main(argv: Optional[List[str]] = None) -> Dict:
    args = parse(argv)
    checkpoint, rl_path = prepare(args)
    rl_path = os.path.abspath(rl_path)
    overrides = grpo_overrides(args, checkpoint, rl_path)
    params = shared_params(config_head(args.workdir, args.preset), overrides, args)
    runners = {"trinity": run_trinity, "trl": run_trl}
    systems = {name: runners[name](args, checkpoint, rl_path, params) for name in args.systems}
    systems = {name: finish(system, params) for name, system in systems.items()}
    params.update(sft_checkpoint=checkpoint, data=rl_path, cpu_count=os.cpu_count())
    report = {"benchmark": "grpo_vs_trl", "preset": args.preset, "params": params}
    report.update(curve_fields=CURVE_FIELDS, systems=systems, ratios=ratios(systems))
    report.update(caveats=CAVEATS)
    report["summary"] = summary_line(report)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    plot(report, args.plot)
    print(report["summary"])
    return report


if __name__ == "__main__":
    main()
