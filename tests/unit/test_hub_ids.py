"""Models and datasets named by hub id, resolved before start against a Hugging Face cache
built by hand in the layout huggingface_hub reads (tests/hub_cache.py), offline
(HF_HUB_OFFLINE=1, set by tests/conftest.py). Errors are one line each, naming the key."""

import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub
import pytest
import yaml
from huggingface_hub import constants, scan_cache_dir, snapshot_download

from tests.hub_cache import cache_dataset, cache_repo, files_of
from trinity.common.config import ConfigError, load_config, save_resolved_config
from trinity.preflight.before_start import check_before_start
from trinity.preflight.model_folders import model_folder_problems
from trinity.utils.hub import HubRef, hub_ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
CONFIG = os.path.join(ROOT, "tests", "integration", "configs", "grpo_small.yaml")
MODEL, DATA = "trinity-tests/micro", "trinity-tests/arithmetic"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache, read as HF_HUB_CACHE would point huggingface_hub at it."""
    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    assert constants.HF_HUB_OFFLINE  # nothing is downloaded in tests
    return str(hub)


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def cached(cache, tmp_path, micro_model, arithmetic_data):
    """The micro model as MODEL and the arithmetic data as DATA (subsets main and hard)."""
    train = _rows(os.path.join(arithmetic_data["rl"], "train.jsonl"))
    test = _rows(os.path.join(arithmetic_data["rl"], "test.jsonl"))
    subsets = {"main": {"train": train, "test": test}, "hard": {"train": train[:8]}}
    return {
        "model": cache_repo(cache, MODEL, files_of(micro_model), refs=("main", "v1")),
        "data": cache_dataset(cache, DATA, subsets, str(tmp_path / "src")),
    }


def config(tmp_path, model=MODEL, data=DATA, *more, path=CONFIG):
    """The small GRPO config on ``model`` and ``data`` (a dataset id: its subset main)."""
    subset = [] if os.path.isabs(data) else ["main"]
    return load_config(
        path,
        [
            f"checkpoint_root_dir={tmp_path / 'ck'}",
            f"model.model_path={model}",
            f"buffer.explorer_input.taskset.path={data}",
            f"buffer.explorer_input.eval_tasksets.0.path={data}",
            *[f"buffer.explorer_input.taskset.subset_name={s}" for s in subset],
            *[f"buffer.explorer_input.eval_tasksets.0.subset_name={s}" for s in subset],
            *more,
        ],
    )


def problems_of(cfg, **kwargs):
    with pytest.raises(ConfigError) as info:
        check_before_start(cfg, **kwargs)
    return info.value.problems


def test_the_hand_built_cache_is_one_huggingface_hub_reads(cached, cache):
    repos = {(r.repo_id, r.repo_type): r for r in scan_cache_dir(cache).repos}
    assert set(repos) == {(MODEL, "model"), (DATA, "dataset")}
    (revision,) = repos[(MODEL, "model")].revisions
    assert revision.refs == {"main", "v1"} and str(revision.snapshot_path) == cached["model"]
    assert snapshot_download(MODEL, local_files_only=True) == cached["model"]
    found = snapshot_download(DATA, repo_type="dataset", local_files_only=True)
    assert found == cached["data"]


def test_every_key_reads_the_snapshot_folder_the_ids_resolve_to(cached, tmp_path):
    (stage,) = check_before_start(config(tmp_path))
    assert stage.model.model_path == cached["model"]
    assert stage.explorer.rollout_model.model_path == cached["model"]
    assert stage.buffer.explorer_input.tasksets[0].path == cached["data"]
    assert stage.buffer.explorer_input.eval_tasksets[0].path == cached["data"]
    save_resolved_config(stage, str(tmp_path / "config.yaml"))  # what every role reads
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["model"]["model_path"] == cached["model"]
    assert saved["buffer"]["explorer_input"]["tasksets"][0]["path"] == cached["data"]


def test_each_id_is_resolved_once_however_many_keys_and_stages_name_it(
    cached, tmp_path, monkeypatch
):
    calls = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )
    staged = tmp_path / "staged.yaml"
    with open(CONFIG) as f:
        staged.write_text(f.read() + "stages: [{stage_name: one}, {stage_name: two}]\n")
    check_before_start(config(tmp_path, path=str(staged)))
    assert sorted(calls) == [DATA, MODEL]


def test_a_revision_follows_the_id_after_an_at_sign(cached, tmp_path):
    (stage,) = check_before_start(config(tmp_path, f"{MODEL}@v1"))
    assert stage.model.model_path == cached["model"]
    assert problems_of(config(tmp_path, f"{MODEL}@v2")) == [
        f"model.model_path = {MODEL}@v2: revision 'v2' of {MODEL} is not in the Hugging Face "
        f"cache, which holds main -> {os.path.basename(cached['model'])[:7]}, v1 -> "
        f"{os.path.basename(cached['model'])[:7]}, and HF_HUB_OFFLINE=1 reads the cache only; "
        f"download it with `hf download {MODEL} --revision v2`, or name a cached revision"
    ]


def test_an_id_neither_a_folder_nor_cached_names_the_key_and_the_download(
    cached, cache, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    found = problems_of(config(tmp_path, "org/missing", "org/no-data"))
    assert found == [
        f"model.model_path = org/missing: no folder {tmp_path / 'org/missing'}, and the model "
        f"org/missing is not in the Hugging Face cache ({cache}); HF_HUB_OFFLINE=1 reads the "
        "cache only: download it with `hf download org/missing`, or give a local folder",
        f"buffer.explorer_input.tasksets[0].path = org/no-data: no folder "
        f"{tmp_path / 'org/no-data'}, and the dataset org/no-data is not in the Hugging Face "
        f"cache ({cache}); HF_HUB_OFFLINE=1 reads the cache only: download it with "
        "`hf download org/no-data --repo-type dataset`, or give a local folder",
    ]  # said once per id, and nothing else repeats it (no "no such folder" lines)


def test_a_subset_that_does_not_exist_lists_those_that_do(cached, tmp_path):
    (line,) = problems_of(
        config(tmp_path, MODEL, DATA, "buffer.explorer_input.taskset.subset_name=easy")
    )
    commit = os.path.basename(cached["data"])
    assert line == (
        f"buffer.explorer_input.tasksets[0] (dataset {DATA}@{commit[:7]}, path "
        f"'{cached['data']}'): `subset_name` 'easy' does not exist; its subsets: main, hard"
    )


def test_an_interrupted_download_is_one_line_with_the_command_that_finishes_it(
    cache, tmp_path, micro_model, arithmetic_data
):
    weights = "model.safetensors"
    snapshot = cache_repo(cache, MODEL, files_of(micro_model), skip=[weights], incomplete=weights)
    found = problems_of(config(tmp_path, MODEL, arithmetic_data["rl"]))
    assert found == [
        f"model.model_path = {MODEL}: the cached snapshot {snapshot} lacks weights "
        "(*.safetensors or pytorch_model*.bin) (an interrupted download left 1 partly "
        f"downloaded file(s)); run `hf download {MODEL}` to finish it"
    ]


def test_a_truncated_weights_file_is_named_before_transformers_reads_it(tmp_path, micro_model):
    folder = tmp_path / "model"
    shutil.copytree(micro_model, folder)
    weights = folder / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(whole - 100)
    assert model_folder_problems("model.model_path", str(folder)) == [
        f"model.model_path = {folder}: model.safetensors is truncated ({whole - 100} of {whole} "
        "bytes); copy or download the model again"
    ]


def test_a_local_folder_named_like_an_id_wins(cached, tmp_path, micro_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(micro_model, tmp_path / "trinity-tests" / "micro")
    (stage,) = check_before_start(config(tmp_path))
    assert stage.model.model_path == MODEL  # the folder ./trinity-tests/micro
    assert stage.buffer.explorer_input.tasksets[0].path == cached["data"]


def test_a_chat_template_path_may_name_a_tokenizer_by_id(cached, tmp_path, micro_model):
    from transformers import AutoTokenizer

    more = f"model.chat_template_path={MODEL}"
    (stage,) = check_before_start(config(tmp_path, MODEL, DATA, more))
    shipped = AutoTokenizer.from_pretrained(micro_model).chat_template
    assert shipped and stage.model.custom_chat_template == shipped


def test_the_studio_reads_the_cache_without_downloading(cache, tmp_path, arithmetic_data):
    (line,) = problems_of(config(tmp_path, "org/missing", arithmetic_data["rl"]), download=False)
    assert (
        "the cache is read without downloading here: download it with `hf download org/missing`"
        in line
    )


@pytest.mark.parametrize(
    "value,expected",
    [
        (
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            HubRef("HuggingFaceTB/SmolLM2-135M-Instruct", None, "model"),
        ),
        ("gpt2", HubRef("gpt2", None, "model")),
        (
            "Qwen/Qwen2.5-1.5B-Instruct@refs/pr/1",
            HubRef("Qwen/Qwen2.5-1.5B-Instruct", "refs/pr/1", "model"),
        ),
        ("./model", None),
        ("/abs/model", None),
        ("~/model", None),
        ("a/b/c", None),
        ("data/train.jsonl", None),
        ("org/name@", None),
        ("org--x/name", None),
        ("org/na..me", None),
        ("org/name.", None),
        ("", None),
    ],
)
def test_what_reads_as_a_hub_id(value, expected):
    assert hub_ref(value, "model") == expected


class _Hub(BaseHTTPRequestHandler):
    """The hub's answers to a repository look-up, by the repository's name: the error codes
    huggingface_hub turns into its exceptions."""

    ANSWERS = {
        "gated": (401, "GatedRepo"),
        "private": (401, "RepoNotFound"),
        "old": (404, "RevisionNotFound"),
    }

    def do_GET(self):  # noqa: N802 (http.server's name)
        parts = self.path.split("/")
        code, error = self.ANSWERS.get(parts[4] if len(parts) > 4 else "", (404, "EntryNotFound"))
        body = b'{"error": "no"}'
        self.send_response(code)
        self.send_header("X-Error-Code", error)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def online(cache, monkeypatch):
    """The hub reachable, answered by a local server (HF_ENDPOINT as huggingface_hub reads it)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield constants.ENDPOINT
    server.shutdown()


def test_what_the_hub_refuses_is_one_line_each(online, tmp_path, arithmetic_data):
    data = arithmetic_data["rl"]
    (gated,) = problems_of(config(tmp_path, "org/gated", data))
    assert gated == (
        f"model.model_path = org/gated: org/gated is a gated repository: accept its conditions "
        f"on {online}/org/gated and log in (`hf auth login`, or set HF_TOKEN)"
    )
    (private,) = problems_of(config(tmp_path, "org/private", data))
    assert private == (
        f"model.model_path = org/private: no folder {os.path.abspath('org/private')}, and no "
        "model org/private on the hub that this login may read (a private repository needs "
        "`hf auth login` or HF_TOKEN); check the name"
    )
    (old,) = problems_of(config(tmp_path, "org/old@v0", data))
    assert old == (
        f"model.model_path = org/old@v0: org/old has no revision 'v0' on the hub; use a "
        f"branch, tag or commit of {online}/org/old"
    )
