"""A run started where the folder an example reads from is missing: one problem about that
folder, not one per path in it, and for a demo's folder the command that builds it."""

import os
import shlex

import pytest
from typer.testing import CliRunner

from trinity.cli.main import app
from trinity.common.config.loader import env_folder_defaults
from trinity.demo import DEMOS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")
EXAMPLES = [(name, args) for name, demo in DEMOS.items() for args in demo.examples]


def problems(args, folder):
    """The problem lines ``trinity run`` prints, run from ``folder``."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, ["run", *args])
    finally:
        os.chdir(here)
    assert result.exit_code == 2, result.output
    return [line.strip()[2:] for line in result.output.splitlines() if line.startswith("  - ")]


def run_args(example):
    """`trinity run` arguments of a DEMOS example line, its paths made absolute."""
    config, *rest = shlex.split(example)
    folder = [i > 0 and rest[i - 1] == "--plugin-dir" for i in range(len(rest))]
    rest = [os.path.join(ROOT, t) if f else t for f, t in zip(folder, rest, strict=True)]
    return ["--config", os.path.join(ROOT, config), *rest]


def test_the_examples_folders_are_found_from_their_interpolation():
    assert env_folder_defaults(QUICKSTART) == {"TRINITY_QUICKSTART_DIR": "./quickstart"}
    nested = {"model": {"model_path": "${oc.env:A,${oc.env:B,./b}/model}"}}
    assert env_folder_defaults(nested) == {"B": "./b"}
    assert env_folder_defaults({"checkpoint_root_dir": "${oc.env:C,./c}"}) == {}  # no path in it


def test_the_quickstart_run_from_an_empty_folder_says_once_how_to_prepare_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TRINITY_QUICKSTART_DIR", raising=False)
    lines = problems(["--config", QUICKSTART], tmp_path)
    folder = os.path.join(str(tmp_path), "quickstart")
    assert len(lines) == 1, lines
    assert f"no such folder {folder} (TRINITY_QUICKSTART_DIR is not set" in lines[0]
    assert "model.model_path, buffer.trainer_input.experience_buffer" in lines[0]
    assert lines[0].endswith(
        "run `trinity prepare-quickstart --out ./quickstart` first, or set "
        "TRINITY_QUICKSTART_DIR to the folder it wrote"
    )
    assert not os.path.exists(tmp_path / "checkpoints")


@pytest.mark.parametrize("demo,example", EXAMPLES, ids=[e for _, e in EXAMPLES])
def test_every_demo_example_names_its_prepare_command(demo, example, tmp_path, monkeypatch):
    missing = str(tmp_path / "not_prepared")
    monkeypatch.setenv(DEMOS[demo].variable, missing)
    lines = problems(run_args(example), tmp_path)
    task = "" if demo == "arithmetic" else f" --task {demo}"
    hint = f"run `trinity prepare-quickstart{task} --out {missing}` first"
    assert [line for line in lines if hint in line], lines
    # every other line about a path in that folder was folded into that one
    assert not [line for line in lines if missing + os.sep in line and hint not in line], lines


def test_a_folder_written_in_the_config_gets_no_prepare_hint(tmp_path):
    """Without the variable the hint would be false: each missing path is its own line."""
    text = (
        open(QUICKSTART).read().replace("${oc.env:TRINITY_QUICKSTART_DIR,./quickstart}", "./mine")
    )
    (tmp_path / "mine.yaml").write_text(text)
    lines = problems(["--config", str(tmp_path / "mine.yaml")], tmp_path)
    assert len(lines) == 4 and not [line for line in lines if "prepare-quickstart" in line]
    assert any(f"no such folder {tmp_path}/mine/model" in line for line in lines)


def test_a_users_own_variable_is_said_once_without_the_prepare_hint(tmp_path, monkeypatch):
    monkeypatch.delenv("MY_RUN_DIR", raising=False)
    text = open(QUICKSTART).read().replace("TRINITY_QUICKSTART_DIR", "MY_RUN_DIR")
    (tmp_path / "mine.yaml").write_text(text)
    lines = problems(["--config", str(tmp_path / "mine.yaml")], tmp_path)
    assert len(lines) == 1 and "prepare-quickstart" not in lines[0]
    assert f"no such folder {tmp_path}/quickstart (MY_RUN_DIR is not set" in lines[0]


def test_a_folder_that_exists_keeps_each_problem_of_its_contents(tmp_path, monkeypatch):
    """Prepared elsewhere, or half prepared: the folder is there, so no hint; each missing
    part is said as before."""
    (tmp_path / "qs").mkdir()
    monkeypatch.setenv("TRINITY_QUICKSTART_DIR", str(tmp_path / "qs"))
    lines = problems(["--config", QUICKSTART], tmp_path)
    assert len(lines) == 4 and not [line for line in lines if "prepare-quickstart" in line]
