"""The GSM8K example as shipped (model and data by hub id), run by the CLI in a process of its
own against a Hugging Face cache in a temporary HF_HOME, offline (HF_HUB_OFFLINE=1,
HF_DATASETS_OFFLINE=1). The cache is built by hand in the layout huggingface_hub reads
(tests/hub_cache.py) from SmolLM2-135M-Instruct's folder (the real one, where the example is
the point; the micro model, where only the messages are) and the project's word problems,
written as GSM8K's repository holds them."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from huggingface_hub import scan_cache_dir

from tests.hub_cache import cache_dataset, cache_repo, files_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
EXAMPLE = "examples/gsm8k/grpo.yaml"
SMOLLM2, GSM8K = "HuggingFaceTB/SmolLM2-135M-Instruct", "openai/gsm8k"


# The example's hub ids unchanged, its run cut to 2 small steps in fp32 (the CPU default: bf16
# is 2-3x faster on a CPU with bf16 instructions, about 100x slower on one without), without
# the export of the final weights.
SHORTER = [
    "buffer.total_steps=2",
    "buffer.batch_size=1",
    "algorithm.repeat_times=2",
    "model.max_response_tokens=8",
    "trainer.save_interval=0",
    "trainer.save_hf_checkpoint=never",
]


def _gsm8k_rows(path):
    """Word problems with answers written as GSM8K writes them: a solution ending '#### N'."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [
        {"question": r["question"], "answer": f"The answer is {r['answer']}.\n#### {r['answer']}"}
        for r in rows
    ]


def build_cache(tmp_path, model_folder):
    """HF_HOME/hub holding the model under SmolLM2's id and the problems as openai/gsm8k
    (subsets main and socratic, splits train and test); returns HF_HOME and the snapshots."""
    from trinity.demo.word_problems import make_word_problems

    data = make_word_problems(str(tmp_path / "problems"), n_train=8, n_test=2, n_sft=1)
    train = _gsm8k_rows(os.path.join(data["rl_path"], "train.jsonl"))
    test = _gsm8k_rows(os.path.join(data["rl_path"], "test.jsonl"))
    home = tmp_path / "hf"
    hub = str(home / "hub")
    files = {k: v for k, v in files_of(model_folder).items() if not k.startswith("trinity_")}
    subsets = {s: {"train": train, "test": test} for s in ("main", "socratic")}
    snapshots = {
        "model": cache_repo(hub, SMOLLM2, files),
        "data": cache_dataset(hub, GSM8K, subsets, str(tmp_path / "gsm8k")),
    }
    # the layout is the one huggingface_hub reads: its own scan finds both, at those commits
    found = {r.repo_id: r for r in scan_cache_dir(hub).repos}
    assert {r: {str(v.snapshot_path) for v in found[r].revisions} for r in found} == {
        SMOLLM2: {snapshots["model"]},
        GSM8K: {snapshots["data"]},
    }
    return str(home), snapshots


def trinity(home, tmp_path, *args):
    """``trinity run --config EXAMPLE <args>`` from the repository root, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HF_"))}
    env.update(
        HF_HOME=home,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRINITY_CHECKPOINT_ROOT_DIR=str(tmp_path / "ck"),
    )
    command = [sys.executable, "-m", "trinity.cli.main", "run", "--config", EXAMPLE, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_gsm8k_example_runs_two_grpo_steps_from_the_cache(tmp_path, smollm2_model):
    home, snapshots = build_cache(tmp_path, smollm2_model)
    done = trinity(home, tmp_path, *SHORTER)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (job_dir,) = [
        os.path.join(r, "smollm2_grpo")
        for r, d, _ in os.walk(tmp_path / "ck")
        if "smollm2_grpo" in d
    ]
    with open(os.path.join(job_dir, "monitor", "trainer.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2]
    with open(os.path.join(job_dir, "config.yaml")) as f:
        resolved = yaml.safe_load(f)  # what every role read: the snapshot folders
    assert resolved["model"]["model_path"] == snapshots["model"]
    assert resolved["explorer"]["rollout_model"]["model_path"] == snapshots["model"]
    taskset, evalset = (
        resolved["buffer"]["explorer_input"][key][0] for key in ("tasksets", "eval_tasksets")
    )
    assert (taskset["path"], taskset["subset_name"]) == (snapshots["data"], "main")
    assert evalset["path"] == snapshots["data"]


@pytest.fixture
def micro_cache(tmp_path, micro_model):
    return build_cache(tmp_path, micro_model)


def test_a_missing_id_a_wrong_subset_and_a_wrong_revision_stop_before_start(tmp_path, micro_cache):
    home, snapshots = micro_cache
    done = trinity(
        home,
        tmp_path,
        f"model.model_path={SMOLLM2}@v2",
        "buffer.explorer_input.taskset.subset_name=sokratic",
        "buffer.explorer_input.eval_tasksets.0.path=openai/gsm9k",
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    commit, data = os.path.basename(snapshots["model"])[:7], snapshots["data"]
    lines = [line.strip() for line in done.stderr.splitlines()]
    assert lines[lines.index("error: Invalid configuration (3 problem(s)):") + 1 :] == [
        f"- model.model_path = {SMOLLM2}@v2: revision 'v2' of {SMOLLM2} is not in the Hugging "
        f"Face cache, which holds main -> {commit}, and HF_HUB_OFFLINE=1 reads the cache "
        f"only; download it with `hf download {SMOLLM2} --revision v2`, or name a cached "
        "revision",
        "- buffer.explorer_input.eval_tasksets[0].path = openai/gsm9k: no folder "
        f"{os.path.join(ROOT, 'openai/gsm9k')}, and the dataset openai/gsm9k is not in the "
        f"Hugging Face cache ({home}/hub); HF_HUB_OFFLINE=1 reads the cache only: download it "
        "with `hf download openai/gsm9k --repo-type dataset`, or give a local folder",
        f"- buffer.explorer_input.tasksets[0] (dataset {GSM8K}@{os.path.basename(data)[:7]}, "
        f"path '{data}'): `subset_name` 'sokratic' does not exist; its subsets: main, socratic",
    ]
    assert not os.path.exists(tmp_path / "ck")  # nothing started, nothing written
