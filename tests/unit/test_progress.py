"""Console progress: a line per N steps off-terminal, a live display on one; only the numbers
the stage's algorithm produces."""

import io
import json
import os
from types import SimpleNamespace

from rich.console import Console

from trinity.runtime.progress import ProgressPrinter
from trinity.runtime.stage_progress import StageProgress, clock


def stage_config(job_dir, mode="both", algorithm="grpo", sync_method="memory"):
    return SimpleNamespace(
        checkpoint_job_dir=str(job_dir),
        name="exp",
        mode=mode,
        algorithm=SimpleNamespace(algorithm_type=algorithm),
        synchronizer=SimpleNamespace(sync_method=sync_method),
        cluster=SimpleNamespace(gpu_per_node=0),
    )


def test_an_nccl_stage_says_which_backend_carries_the_weights(tmp_path):
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=200))
    printer.begin_stage(stage_config(tmp_path, sync_method="nccl"), steps=2, start=0)
    assert "weight sync: nccl, a gloo broadcast from the trainer to the engines" in out.getvalue()


def append(job_dir, role, *records):
    os.makedirs(os.path.join(job_dir, "monitor"), exist_ok=True)
    with open(os.path.join(job_dir, "monitor", f"{role}.jsonl"), "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_the_line_says_step_of_total_eta_numbers_and_last_eval():
    progress = StageProgress("exp", total=10)
    progress.started -= 20  # 20 s in, 4 steps done: 5 s a step, 6 to go
    progress.update("explorer", {"step": 0, "eval/t/accuracy/mean": 0.25})
    progress.update("explorer", {"step": 4, "rollout/reward/mean": 0.5})
    progress.update("trainer", {"step": 4, "actor/pg_loss": -0.01, "actor/lr": 1e-3})
    line = progress.line()
    assert line.startswith("exp | step 4/10  0:00:20 elapsed, ETA 0:00:30 | ")
    assert "reward 0.5  pg_loss -0.01" in line and "lr" not in line
    assert line.endswith("| eval (step 0): t accuracy 0.250")


def test_an_sft_stage_shows_its_loss_and_no_reward():
    progress = StageProgress("sft", total=3)
    progress.update("trainer", {"step": 1, "actor/sft_loss": 2.5, "critic/rewards/mean": 0.0})
    assert progress.numbers == {"sft_loss": 2.5}
    assert "reward" not in progress.line() and "ETA" in progress.line()


def test_a_resumed_stage_times_only_the_steps_it_ran():
    progress = StageProgress("exp", total=10, start=6)
    progress.started -= 8
    progress.update("trainer", {"step": 8})
    assert abs(progress.timing()[1] - 8.0) < 0.5  # 2 steps in 8 s; 2 to go
    assert clock(3725) == "1:02:05"


def test_off_a_terminal_one_line_every_n_steps_and_each_eval(tmp_path):
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=60), every_steps=2, every_s=1e9)
    printer.begin_stage(stage_config(tmp_path), steps=5, start=0)
    assert printer.live is None
    for step in range(1, 6):
        append(tmp_path, "trainer", {"step": step, "actor/pg_loss": 0.1 * step})
    append(tmp_path, "explorer", {"step": 5, "eval/arith/accuracy/mean": 0.5})
    printer.poll()
    printer.summary([])
    lines = [line for line in out.getvalue().splitlines() if "| step" in line]
    # steps 2 and 4 (every 2), then 5 (the last step); each on one line however long
    assert [line.split("| step ")[1].split()[0] for line in lines] == ["2/5", "4/5", "5/5"]
    assert "eval     step    5  arith accuracy=0.500" in out.getvalue()


def test_on_a_terminal_a_live_display_that_shows_the_wait(tmp_path):
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=100, force_terminal=True))
    printer.begin_stage(stage_config(tmp_path), steps=4, start=0)
    assert printer.live is not None
    append(tmp_path, "trainer", {"step": 3, "actor/pg_loss": 0.2})
    printer.poll(({"trainer": ("explore step 4", 0.0)}, []))  # waiting since 1970
    rendered = io.StringIO()
    Console(file=rendered, width=100).print(printer.progress.render())
    assert "step 3/4" in rendered.getvalue() and "pg_loss 0.2" in rendered.getvalue()
    assert "for explore step 4" in rendered.getvalue()
    printer.end_stage()
    assert printer.live is None


def test_in_a_log_one_wait_is_printed_once_not_at_every_change(tmp_path, monkeypatch):
    """A wait keeps its start while its text changes (the tasks left, the oldest): it is
    printed when it has lasted SHOW_WAIT_AFTER_S, again every REPEAT_WAIT_S, and a new wait
    (a new start) is printed on its own."""
    import trinity.runtime.progress as progress

    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=200, force_terminal=False))
    printer.begin_stage(stage_config(tmp_path), steps=4, start=0)
    now = [1000.0]
    monkeypatch.setattr(progress.time, "time", lambda: now[0])
    began = 990.0
    for left in (64, 50, 31, 12):  # one evaluation, finishing tasks over 4 s
        printer.poll(({"explorer": (f"{left} task(s) of eval to finish", began)}, []))
        now[0] += 1.0
    now[0] = began + progress.REPEAT_WAIT_S + 11  # half a minute later, still waiting
    printer.poll(({"explorer": ("3 task(s) of eval to finish", began)}, []))
    printer.poll(({"explorer": ("64 task(s) of eval to finish", now[0] - 6)}, []))  # the next
    lines = [line.strip() for line in out.getvalue().splitlines() if "waiting" in line]
    assert lines == [
        "explorer waiting 10s for 64 task(s) of eval to finish",
        "explorer waiting 41s for 3 task(s) of eval to finish",
        "explorer waiting 6s for 64 task(s) of eval to finish",
    ]


def test_a_bench_stage_counts_checkpoints_not_their_train_steps(tmp_path):
    """Bench evaluates 3 checkpoints (steps 0, 150, 350): 2 done reads 2/3, not 350/3."""
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=200), every_steps=1, every_s=1e9)
    printer.begin_stage(stage_config(tmp_path, mode="bench"), steps=3, start=0)
    append(tmp_path, "bench", *({"step": s, "bench/t/accuracy/mean": 0.5} for s in (0, 150)))
    printer.poll()
    assert printer.progress.step == 2
    line = printer.progress.line()
    assert "| checkpoint 2/3 " in line and "| bench (step 150): t accuracy 0.500" in line


def test_off_a_terminal_the_bench_table_is_not_cut_to_80_columns(capsys):
    """The default console: a pipe or log gets every column whole."""
    tasksets = [f"a_long_taskset_name_{i}" for i in range(4)]
    record = {"step": 350, **{f"bench/{t}/accuracy/mean": 0.5 for t in tasksets}}
    result = SimpleNamespace(
        name="exp", job_dir="/nowhere", final_hf=None, evals={}, bench=[record]
    )
    ProgressPrinter().summary([result])
    out = capsys.readouterr().out
    for taskset in tasksets:
        assert f"{taskset} accuracy" in out
    assert max(len(line) for line in out.splitlines()) > 80


def test_a_wait_shorter_than_the_usual_step_is_not_news(tmp_path, monkeypatch):
    """A fixed-sync run whose train step takes ~8 s: the explorer waits ~6 s for the weights
    at every step, which is the schedule; a wait of more than two usual steps is printed."""
    import trinity.runtime.progress as progress
    import trinity.runtime.stage_progress as stage_progress

    clock_s = [1000.0]
    for module in (progress, stage_progress):
        monkeypatch.setattr(module.time, "time", lambda: clock_s[0])
        monkeypatch.setattr(module.time, "monotonic", lambda: clock_s[0])
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=200, force_terminal=False))
    printer.begin_stage(stage_config(tmp_path), steps=10, start=0)
    printer.progress.started = printer.progress.advanced = clock_s[0]  # read the real clock
    for step in range(1, 7):  # 8 s a step: the explorer explores 2 s, then waits 6 s
        clock_s[0] += 2.0
        since = clock_s[0]
        clock_s[0] += 4.0  # the first step's wait is seen before a step was timed
        printer.poll(({"explorer": (f"the trainer to publish model version {step}", since)}, []))
        clock_s[0] += 2.0
        if step > 1:
            printer.poll(
                ({"explorer": (f"the trainer to publish model version {step}", since)}, [])
            )
        append(tmp_path, "trainer", {"step": step, "actor/pg_loss": 0.1})
        printer.poll(({}, []))
    assert printer.progress.usual_step_s() == 8.0
    assert "waiting" not in out.getvalue()
    since = clock_s[0]
    clock_s[0] += 17.0  # more than two usual steps: something is slow
    printer.poll(({"explorer": ("the trainer to publish model version 7", since)}, []))
    lines = [line.strip() for line in out.getvalue().splitlines() if "waiting" in line]
    assert lines == ["explorer waiting 17s for the trainer to publish model version 7"]


def test_before_a_step_was_timed_a_wait_shows_after_a_few_seconds(tmp_path):
    printer = ProgressPrinter(Console(file=io.StringIO()))
    printer.begin_stage(stage_config(tmp_path), steps=10, start=0)
    assert printer.show_waits_after() == 5.0
