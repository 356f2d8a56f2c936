"""Every YAML under examples/ loads and validates (with its environment defaults), and its
header says which command prepares its data, how to run it and which variables it reads."""

import glob
import os
import re

import pytest

from trinity.common.config import load_config
from trinity.demo import DEMOS, run_commands
from trinity.preflight.derive import finalize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.yaml"), recursive=True))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.relpath(p, ROOT))
def test_example_config_validates(path):
    config = load_config(path)
    stages = [finalize(stage) for stage in config.stage_configs()]
    assert stages and all(s.buffer.batch_size > 0 for s in stages)


def test_there_are_examples():
    assert EXAMPLES


def header(path):
    """The leading comment block: 'Key: value' entries, continuation lines joined."""
    entries, key = {}, None
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            text = line[1:].strip()
            match = re.match(r"(Prepare|Run|Reads|Shorter):\s+(.*)", text)
            if match:
                key = match.group(1)
                entries.setdefault(key, []).append(match.group(2))
            elif key and line.startswith("#   "):
                entries[key].append(text)
            else:
                key = None
    return entries


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.relpath(p, ROOT))
def test_example_header_says_what_it_needs(path):
    """Prepare names a demo listing this example (Run lines are the commands
    prepare-quickstart prints), or the `hf download` of each hub id the YAML names; Reads
    names exactly the variables the YAML reads."""
    entries = header(path)
    relpath = os.path.relpath(path, ROOT)
    with open(path) as f:
        text = f.read()
    used = set(re.findall(r"oc\.env:(\w+)", text))
    named = {line.split()[0] for line in entries["Reads"]}
    assert {name for name in named if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)} == used
    runs = [line.removeprefix("trinity run --config ") for line in entries["Run"]]
    if entries["Prepare"][0].startswith("hf download "):
        ids = [line.split()[2] for line in entries["Prepare"] if line.startswith("hf download ")]
        named_ids = set(re.findall(r"\b(?:model_path|path): ([\w.-]+/[\w.-]+)", text))
        assert set(ids) == named_ids
        assert runs == [relpath]
        return
    [task] = re.findall(r"prepare-quickstart --task (\w+) --out", entries["Prepare"][0])
    ours = [args for args in DEMOS[task].examples if args.split()[0] == relpath]
    assert runs == ours
    assert DEMOS[task].variable in used


def test_every_demo_example_exists():
    for demo in DEMOS.values():
        for args in demo.examples:
            assert os.path.isfile(os.path.join(ROOT, args.split()[0])), args


def test_run_commands_point_the_example_at_the_folder_written(tmp_path):
    out = os.path.join(tmp_path, "my data")
    commands = run_commands("arithmetic", out)
    assert commands[0] == (
        f"TRINITY_QUICKSTART_DIR='{out}' trinity run --config examples/quickstart/arithmetic.yaml"
    )


def test_judge_model_follows_the_quickstart_folder(monkeypatch):
    monkeypatch.delenv("JUDGE_MODEL", raising=False)
    monkeypatch.setenv("TRINITY_QUICKSTART_DIR", "/data/qs")
    config = load_config(os.path.join(ROOT, "examples", "judge", "judge.yaml"))
    assert config.explorer.auxiliary_models[0].model_path == "/data/qs/model"
