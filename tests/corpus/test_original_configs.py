"""The original Trinity-RFT's example configs, from every release (tests/corpus/trinity_rft/),
each run as written on this CPU machine (tests/corpus/harness.py): what each does is what
``expected.yaml`` says, trains one step or is refused before start for the reason it names.

An entry the product does not meet yet carries ``now:`` (what happens instead) and runs as a
strict xfail: once it behaves, the test fails until ``now:`` is removed from the manifest;
when something else happens instead, it fails until ``now:`` says what.
Marked ``corpus``: a run of every config takes longer than the main suite allows, so CI runs
it as its own step (``.ci/run``), less the runs that start vLLM's CPU engine (also marked
``vllm``: a minute or more each to start, the engine itself tested in the slow tier's
tests/integration/test_vllm.py); ``-m corpus`` runs them all.
"""

from __future__ import annotations

from typing import Dict

import pytest

from tests.corpus.harness import (
    Entry,
    Harness,
    Outcome,
    check_said,
    read_manifest,
    starts_vllm,
    verdict,
)

pytestmark = pytest.mark.corpus

ENTRIES = read_manifest()
BY_CONFIG: Dict[str, Entry] = {e.label: e for e in ENTRIES}


def _param(entry: Entry):
    # Only the assertion of the outcome is the expected failure: a stale `now:` is a failure.
    xfail = pytest.mark.xfail(strict=True, raises=AssertionError, reason=entry.now)
    marks = [xfail] if entry.now else []
    if starts_vllm(entry):  # a minute or more each to start vLLM's CPU engine
        marks.append(pytest.mark.vllm)
    return pytest.param(entry, id=entry.label, marks=marks)


@pytest.fixture(scope="session")
def harness(tmp_path_factory, micro32_model) -> Harness:
    from huggingface_hub import constants

    return Harness(str(tmp_path_factory.mktemp("corpus")), micro32_model, constants.HF_HUB_CACHE)


@pytest.fixture(autouse=True)
def user_environment(tmp_path, monkeypatch):
    """A user who set none of the variables the examples read (``TRINITY_MODEL_PATH``, ...):
    their defaults apply and the harness fills the rest. wandb, which some examples log to,
    runs offline as the Hugging Face libraries do (tests/conftest.py)."""
    import os

    for name in [n for n in os.environ if n.startswith("TRINITY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb"))


def outcome_of(entry: Entry, harness: Harness) -> Outcome:
    from trinity.runtime.launcher import run

    if entry.after:  # the other half of a decoupled pair runs first, in the same folder
        harness.run(BY_CONFIG[entry.after], run)
    return harness.run(entry, run)


@pytest.mark.parametrize("entry", [_param(e) for e in ENTRIES])
def test_the_config_does_what_the_manifest_says(entry: Entry, harness: Harness) -> None:
    outcome = outcome_of(entry, harness)
    check_said(entry, outcome)  # what the table says happens is what happens
    problem = verdict(entry, outcome)
    assert problem is None, problem
