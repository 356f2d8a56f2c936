"""Demo tasks and environments that run offline: synthetic data from a seed
(docs/design-notes.md, "Principles").

``tiny`` builds the tiny model family (a character-level tokenizer and a small Llama) and
``synthetic`` the seeded arithmetic and countdown data and the quickstart bundle. This package
imports nothing else of ``trinity``: the built-in workflows (``trinity.common.workflows``)
play its environments, so it sits below them.

``DEMOS`` names, for each demo, the ``prepare(root) -> {"model_path", "sft_path",
"rl_path"}`` function that builds a tiny model and the demo's data under ``root``, the
example configs that run on it and the variable they read its folder from;
``trinity prepare-quickstart --task NAME --out ROOT`` calls it (``prepare_demo``) and
prints how to run the examples on ``ROOT`` (``run_commands``).

- ``arithmetic``: single-turn addition (``trinity.demo.synthetic.prepare_quickstart``),
  ``examples/quickstart/arithmetic.yaml``.
- ``guess_number``: a multi-turn game with feedback (``trinity.demo.guess_number``), played by
  ``guess_number_workflow``, ``examples/guess_number/guess_number.yaml``.
- ``calculator``: tool use, multiplication with a ``calc`` tool (``trinity.demo.calculator``),
  played by an agent that only knows ``openai.OpenAI``, ``examples/calculator_agent``.
- ``smollm2``: a real model, SmolLM2-135M-Instruct (imported from the ``smollm2`` extra's GGUF
  file), with word problems in plain English (``trinity.demo.word_problems``),
  ``examples/smollm2``; the ``examples/environments`` configs use its model only.

To add an environment: write a module here with the environment (an episode object with an
opening message and a ``step(reply)``, seeded, no network), a ``make_*`` function writing its
tasks as JSON lines (train and a held-out test split) and, if the model needs a warm-up, SFT
rows in a format the SFT reader takes (``messages`` for dialogues); a ``prepare_*`` function
building all of it next to a tiny model; a workflow in ``trinity/common/workflows/`` that
plays one task and returns experiences (multi-turn: one per episode, with
``trinity.common.workflows.multiturn.merge_turns``); an example config under ``examples/``
(its header says what it needs, as the others do); then name the ``prepare_*`` function, the
example and its variable in ``DEMOS``. Keep the module's imports light: workflows import the
environment in every rollout process.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
from typing import Any, Dict, List, NamedTuple, Optional


class Demo(NamedTuple):
    """One demo: how it is built and which example configs run on what it builds."""

    prepare: str  # "module:function", imported on use: listing demos loads no model code
    variable: str  # the environment variable the examples read the --out folder from
    examples: List[str]  # `trinity run --config` arguments of the examples reading that folder


DEMOS: Dict[str, Demo] = {
    "arithmetic": Demo(
        "trinity.demo.synthetic:prepare_quickstart",
        "TRINITY_QUICKSTART_DIR",
        [
            "examples/quickstart/arithmetic.yaml",
            "examples/judge/judge.yaml",
            "examples/decoupled/arithmetic_grpo.yaml mode=train",
            "examples/decoupled/arithmetic_grpo.yaml mode=explore",
            "examples/serve/serve.yaml",
        ],
    ),
    "guess_number": Demo(
        "trinity.demo.guess_number:prepare_guess_number",
        "TRINITY_GUESS_NUMBER_DIR",
        ["examples/guess_number/guess_number.yaml"],
    ),
    "calculator": Demo(
        "trinity.demo.calculator:prepare_calculator",
        "TRINITY_CALCULATOR_DIR",
        ["examples/calculator_agent/calculator_agent.yaml --plugin-dir examples/calculator_agent"],
    ),
    "judges": Demo(
        "trinity.demo.judges:prepare_judges",
        "TRINITY_JUDGES_DIR",
        ["examples/judges/ruler.yaml", "examples/judges/rubric.yaml"],
    ),
    "smollm2": Demo(
        "trinity.demo.word_problems:prepare_smollm2",
        "TRINITY_SMOLLM2_DIR",
        [
            "examples/smollm2/grpo.yaml",
            "examples/smollm2/grpo_vllm.yaml",
            "examples/smollm2/grpo_tinker.yaml",
            "examples/environments/reasoning_gym.yaml",
            "examples/environments/textarena.yaml",
            "examples/environments/openenv.yaml",
            "examples/environments/verifiers.yaml",
        ],
    ),
}


def prepare_demo(name: str, root: str) -> Dict[str, str]:
    """Build demo ``name``'s tiny model and data under ``root``; return their paths."""
    if name not in DEMOS:
        raise KeyError(f"unknown demo '{name}'; choose one of {', '.join(sorted(DEMOS))}")
    module, function = DEMOS[name].prepare.split(":")
    return getattr(importlib.import_module(module), function)(root)


def run_commands(name: str, root: str) -> List[str]:
    """The shell commands that run demo ``name``'s examples on the folder ``root``."""
    demo = DEMOS[name]
    folder = shlex.quote(os.path.abspath(root))
    return [f"{demo.variable}={folder} trinity run --config {args}" for args in demo.examples]


class DemoBuildError(RuntimeError):
    """A demo's model could not be built as asked; the message says why and what to change."""


def read_marker(path: str) -> Optional[Dict[str, Any]]:
    """The arguments a demo's data was built with (its JSON marker), or None if not built."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


__all__ = ["DEMOS", "Demo", "DemoBuildError", "prepare_demo", "read_marker", "run_commands"]
