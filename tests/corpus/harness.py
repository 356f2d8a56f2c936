"""Run one of the original Trinity-RFT's example configs (tests/corpus/trinity_rft/) as a user
would on this machine, and say what happened: it trained one step, it was refused before
start, or it failed after start; with the first line of the message.

A run takes the config file as written, from a copy of its release's folder as the working
directory (the early releases name their veRL files and data relative to the repository
root), with only the overrides of ``plan.py``. Models and datasets named by hub id are served
from a Hugging Face cache the harness builds (``tests/hub_cache.py``) in the cache
``huggingface_hub`` reads (``HF_HOME`` of ``tests/conftest.py``, offline): every model id is the
tiny local model (preset micro32, whose heads vLLM's CPU build runs), every dataset a few
synthetic rows with the columns the config names.
Runs go through ``trinity.runtime.launcher.run``, what ``trinity run`` calls, in this process.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import yaml

from tests.corpus.plan import STEPS, Plan, Storage, make_plan, read_raw, row_columns, walk_all
from tests.hub_cache import cache_repo, files_of

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "trinity_rft")
MANIFEST = os.path.join(CORPUS, "expected.yaml")
ROWS = {"train": 6, "test": 2}  # per split: one batch of 2 and a spare; evaluation is short

# Outcomes: trained a step (an explore-only config: explored one), refused before start,
# failed after start.
TRAINS, EXPLORES, REFUSED, FAILED = "trains", "explores", "refused", "failed"


@dataclass
class Entry:
    """One config of the manifest: what should happen when it runs."""

    config: str  # <release>/examples/.../x.yaml, relative to CORPUS
    expect: str  # TRAINS, EXPLORES (a config of mode explore) or REFUSED
    # REFUSED: regular expressions; a problem matches the first, every problem matches one
    reasons: List[str] = field(default_factory=list)
    needs: Optional[str] = None  # REFUSED: the environment or service outside it needs
    lacks: Optional[str] = None  # REFUSED: the feature this build lacks
    message: Optional[str] = None  # REFUSED as expected: its first line today (a part of it)
    now: Optional[str] = None  # what happens instead, while it does not do what it should
    after: Optional[str] = None  # a config run first in the same folder (the async pair)
    variant: List[str] = field(default_factory=list)  # README-named overrides (algorithm)

    @property
    def release(self) -> str:
        return self.config.split("/", 1)[0]

    @property
    def path(self) -> str:
        return self.config.split("/", 1)[1]

    @property
    def label(self) -> str:
        return self.config + "".join(f" {v}" for v in self.variant)


def read_manifest() -> List[Entry]:
    with open(MANIFEST) as f:
        data = yaml.safe_load(f)
    return [Entry(config=e.pop("config"), **e) for e in data["configs"]]


def corpus_configs() -> List[str]:
    """Every config of the corpus that is run: its YAML files, less those another one names
    (the early releases' veRL files, a Data-Juicer recipe), relative to ``CORPUS``."""
    files = sorted(
        os.path.relpath(p, CORPUS)
        for p in glob.glob(os.path.join(CORPUS, "*", "**", "*.yaml"), recursive=True)
    )
    named = set()
    for name in files:
        release = name.split("/", 1)[0]
        for _, value, _ in walk_all(read_raw(os.path.join(CORPUS, name))):
            if isinstance(value, str) and f"{release}/{value}" in files:
                named.add(f"{release}/{value}")
    return [f for f in files if f not in named]


def starts_vllm(entry: Entry) -> bool:
    """Whether running ``entry`` starts a vLLM engine: it runs (is not refused before start)
    and it, or the config it runs after, names a vllm engine type."""
    if entry.expect == REFUSED:
        return False
    for config in filter(None, (entry.config, entry.after)):
        for path, value, _ in walk_all(read_raw(os.path.join(CORPUS, config))):
            if path.endswith("engine_type") and str(value).startswith("vllm"):
                return True
    return False


@dataclass
class Outcome:
    kind: str  # TRAINS, REFUSED or FAILED
    message: str  # first line (a refusal's first problem); empty when it ran
    steps: List[int] = field(default_factory=list)  # the steps the trainer (explorer) logged
    problems: List[str] = field(default_factory=list)  # every problem a refusal names


class StaleManifest(Exception):
    """The manifest's ``now:`` or ``message:`` is not what the run says any more."""


def check_said(entry: Entry, outcome: Outcome) -> None:
    """Raise ``StaleManifest`` unless the first line the run gave holds the manifest's
    ``now:`` (or, for a refusal as expected, its ``message:``): the table says what happens."""
    said = outcome.message or outcome.kind
    for key in ("now", "message"):
        expected = getattr(entry, key)
        if expected and expected not in said:
            raise StaleManifest(f"{entry.label}: {key}: says {expected!r}; the run says {said!r}")


def verdict(entry: Entry, outcome: Outcome) -> Optional[str]:
    """None when ``outcome`` is what ``entry`` expects, else what differs, in one line."""
    if entry.expect in (TRAINS, EXPLORES):
        if (outcome.kind, outcome.steps) == (entry.expect, [STEPS]):
            return None
        return f"{outcome.kind}: {outcome.message}" if outcome.message else outcome.kind
    if outcome.kind != REFUSED:
        return f"{outcome.kind}, not refused: {outcome.message}"
    if not any(re.search(entry.reasons[0], p) for p in outcome.problems):
        return f"refused without /{entry.reasons[0]}/: {outcome.message}"
    wrong = [p for p in outcome.problems if not any(re.search(r, p) for r in entry.reasons)]
    return f"refused also for: {wrong[0]}" if wrong else None


# ------------------------------------------------------------------ synthetic data


def _value(kind: str, i: int, section: Dict[str, Any]) -> Any:
    """Column ``kind`` (a format key's name without ``_key``) of synthetic row ``i``."""
    a, b = i % 7 + 1, i % 5 + 2
    question, answer = f"What is {a} plus {b}?", f"{a} + {b} = {a + b}.\n#### {a + b}"
    chat = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    wrong = f"{a} + {b} = {a + b + 1}.\n#### {a + b + 1}"
    messages = (section.get("format") or {}).get("prompt_type") == "messages"
    values = {
        "prompt": [chat[0]] if messages else question,
        "response": answer,
        "messages": chat,
        "message": chat,
        "system_prompt": "Answer with a number.",
        "chosen": [chat[1]] if messages else answer,
        "rejected": [{"role": "assistant", "content": wrong}] if messages else wrong,
        "tools": [],
        "feature": float(i % 3),
    }
    return values.get(kind, answer if "answer" in kind or "truth" in kind else question)


def _frozen_lake(i: int) -> Dict[str, Any]:
    return {"seed": 42 + i, "size": 3 + i % 3, "p": 0.8, "index": i, "uid": f"{42 + i}_{i}"}


def _tool_call(i: int) -> Dict[str, Any]:
    a, b = i % 7 + 1, i % 5 + 2
    add = {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"a": "int", "b": "int"},
    }
    return {
        "tools": json.dumps([add]),
        "raw_system": "You may call the functions listed.",
        "conversations": [{"from": "user", "value": f"What is {a} plus {b}?"}],
        "answer": [{"name": "add", "arguments": {"a": a, "b": b}}],
    }


def _rubric(i: int) -> Dict[str, Any]:
    return {"rubric": [{"description": "States the sum as a number.", "weight": 1.0}]}


# The columns a workflow reads beyond those its taskset's `format` names, as the original's
# data preparation scripts (or the hub dataset the example names) write them.
WORKFLOW_COLUMNS: Dict[str, Callable[[int], Dict[str, Any]]] = {
    "frozen_lake_workflow": _frozen_lake,
    "toolcall_workflow": _tool_call,
    "rubric_judge_workflow": _rubric,
}


def synthetic_rows(
    section: Dict[str, Any], n: int, workflow: Optional[str] = None
) -> List[Dict[str, Any]]:
    """``n`` rows with every column the storage's ``format`` names (prompt and response
    under their default names when it names none), and what ``workflow`` reads besides."""
    columns = row_columns(section) or {"prompt": "prompt", "response": "response"}
    extra = WORKFLOW_COLUMNS.get(str(workflow), lambda i: {})
    rows = [{col: _value(kind, i, section) for col, kind in columns.items()} for i in range(n)]
    return [{**row, **extra(i)} for i, row in enumerate(rows)]


def write_dataset(folder: str, subsets: Dict[str, Dict[str, List[dict]]]) -> str:
    """A dataset folder laid out as the hub's are: parquet shards per subset and split, and a
    README whose ``configs:`` name them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = ["---", "configs:"]
    for subset, splits in subsets.items():
        lines += [f"- config_name: {subset}", "  data_files:"]
        for split, rows in splits.items():
            os.makedirs(os.path.join(folder, subset), exist_ok=True)
            target = os.path.join(folder, subset, f"{split}-00000-of-00001.parquet")
            pq.write_table(pa.Table.from_pylist(rows), target)
            lines += [f"  - split: {split}", f"    path: {subset}/{split}-*"]
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("\n".join(lines + ["---", ""]))
    return folder


def _splits(storages: List[Storage]) -> Dict[str, Dict[str, List[dict]]]:
    """{subset: {split: rows}} covering every subset and split the storages name, each row
    with the columns of all of them (a dataset named twice serves both)."""
    section: Dict[str, Any] = {"format": {}}
    for storage in storages:
        fmt = storage.section.get("format") or {}
        section["format"].update({k: v for k, v in fmt.items() if k.endswith("_key")})
        section["format"].setdefault("prompt_type", fmt.get("prompt_type"))
    workflow = next((s.workflow for s in storages if s.workflow in WORKFLOW_COLUMNS), None)
    subsets: Dict[str, Dict[str, List[dict]]] = {}
    for storage in storages:
        splits = subsets.setdefault(storage.subset or "default", {})
        for split in {storage.split or "train", "train", "test"}:
            splits[split] = synthetic_rows(section, ROWS.get(split, ROWS["test"]), workflow)
    return subsets


# ------------------------------------------------------------------ the run


class Harness:
    """The session's hub cache, tiny model and run folders; runs configs and remembers what
    each did (a config another one runs after is run once)."""

    def __init__(self, tmp: str, model: str, hub_cache: str) -> None:
        self.tmp, self.model, self.hub = tmp, model, hub_cache
        self.cached: set = set()
        self.outcomes: Dict[str, Outcome] = {}
        self.folders: Dict[str, str] = {}

    def plan(self, entry: Entry, data_root: str) -> Plan:
        """``entry``'s overrides; the synthetic datasets its fills name are written under
        ``data_root``."""
        counter = iter(range(1000))

        def fill_data(storage: Storage) -> str:
            folder = os.path.join(data_root, f"data{next(counter)}")
            os.makedirs(folder, exist_ok=True)
            return write_dataset(folder, _splits([storage]))

        raw = read_raw(os.path.join(CORPUS, entry.config))
        return make_plan(raw, self.model, fill_data)

    def serve(self, plan: Plan, scratch: str) -> None:
        """Put the plan's hub ids in the cache (the tiny model; synthetic datasets)."""
        for repo_id in plan.models:
            if ("model", repo_id) not in self.cached:
                files = {
                    k: v for k, v in files_of(self.model).items() if not k.startswith("trinity_")
                }
                cache_repo(self.hub, repo_id, files)
                self.cached.add(("model", repo_id))
        by_id: Dict[str, List[Storage]] = {}
        for storage in plan.datasets:
            by_id.setdefault(storage.value.partition("@")[0], []).append(storage)
        for repo_id, storages in by_id.items():
            source = os.path.join(scratch, "hub-src", repo_id.replace("/", "--"))
            shutil.rmtree(source, ignore_errors=True)
            os.makedirs(source)
            write_dataset(source, _splits(storages))
            cache_repo(self.hub, repo_id, files_of(source), repo_type="dataset")

    def run(self, entry: Entry, run: Callable[..., Any]) -> Outcome:
        """Run ``entry`` (once per session) with ``run`` (the launcher's ``run``)."""
        if entry.label in self.outcomes:
            return self.outcomes[entry.label]
        first = self.outcomes.get(entry.after or "")
        if first is not None and first.kind not in (TRAINS, EXPLORES):
            # its explorer half is not running: the trainer half would wait for it (30 min)
            said = f"{entry.after} did not run: {first.message or first.kind}"
            self.outcomes[entry.label] = Outcome(FAILED, said)
            return self.outcomes[entry.label]
        folder = self._folder(entry)
        plan = self.plan(entry, os.path.join(folder, ".corpus-data"))
        self.serve(plan, self.tmp)
        outcome = run_in(folder, entry.path, plan.overrides + entry.variant, run)
        self.outcomes[entry.label] = outcome
        return outcome

    def _folder(self, entry: Entry) -> str:
        """A copy of the release's folder to run in; the one of ``after`` when set."""
        if entry.after:
            if entry.after not in self.folders:
                raise RuntimeError(f"{entry.config}: run {entry.after} first")
            return self.folders[entry.after]
        folder = os.path.join(self.tmp, "runs", entry.label.replace("/", "_").replace(" ", "_"))
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(os.path.join(CORPUS, entry.release), folder)
        self.folders[entry.config] = folder
        return folder


def run_in(folder: str, config: str, overrides: List[str], run: Callable[..., Any]) -> Outcome:
    """``run(config, overrides, [])`` with ``folder`` as the working directory."""
    from trinity.common.config import ConfigError
    from trinity.utils.plugin_loader import PluginError

    before = os.getcwd()
    os.chdir(folder)
    try:
        results = run(config, overrides, [])
    except ConfigError as exc:
        return Outcome(REFUSED, exc.problems[0], problems=exc.problems)
    except PluginError as exc:
        return Outcome(REFUSED, _first_line(exc), problems=[_first_line(exc)])
    except Exception as exc:  # a failure after start: its message is the finding
        return Outcome(FAILED, f"{type(exc).__name__}: {_first_line(exc)}")
    finally:
        os.chdir(before)
    job_dirs = [r.job_dir for r in results]
    steps = logged_steps(job_dirs, "trainer")
    if steps:
        return Outcome(TRAINS, "", steps)
    explored = logged_steps(job_dirs, "explorer")
    if explored and all(_mode(d) == "explore" for d in job_dirs):
        return Outcome(EXPLORES, "", explored)
    return Outcome(FAILED, "the run ended without a train step")


def _mode(job_dir: str) -> str:
    names = glob.glob(os.path.join(job_dir, "*config.yaml"))
    with open(sorted(names)[0]) as f:
        return str(yaml.safe_load(f).get("mode"))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def logged_steps(job_dirs: List[str], role: str) -> List[int]:
    """The steps (from 1) the stages' ``role`` (trainer, explorer) logged metrics for; an
    evaluation before the first step is logged as step 0."""
    steps: set = set()
    for job_dir in job_dirs:
        for path in glob.glob(os.path.join(job_dir, "monitor", f"{role}.jsonl")):
            with open(path) as f:
                steps |= {json.loads(line).get("step", 0) for line in f if line.strip()}
    return sorted(s for s in steps if s >= 1)
