"""Demo tasks and environments that run offline: synthetic data from a seed
(docs/design-notes.md, "Principles").

``tiny`` builds the tiny model family (a character-level tokenizer and a small Llama) and
``synthetic`` the seeded arithmetic and countdown data and the quickstart bundle. This package
imports nothing else of ``trinity``: the built-in workflows (``trinity.common.workflows``)
play its environments, so it sits below them.

``DEMOS`` names, for each demo, the ``prepare(root) -> {"model_path", "sft_path",
"rl_path"}`` function that builds a tiny model and the demo's data under ``root``;
``trinity prepare-quickstart --task NAME --out ROOT`` calls it (``prepare_demo``).

- ``arithmetic``: single-turn addition (``trinity.demo.synthetic.prepare_quickstart``),
  ``examples/quickstart/arithmetic.yaml``.
- ``guess_number``: a multi-turn game with feedback (``trinity.demo.guess_number``), played by
  ``guess_number_workflow``, ``examples/guess_number/guess_number.yaml``.
- ``calculator``: tool use, multiplication with a ``calc`` tool (``trinity.demo.calculator``),
  played by an agent that only knows ``openai.OpenAI``, ``examples/calculator_agent``.
- ``smollm2``: a real model, SmolLM2-135M-Instruct (imported from the ``smollm2`` extra's GGUF
  file), with word problems in plain English (``trinity.demo.word_problems``),
  ``examples/smollm2``.

To add an environment: write a module here with the environment (an episode object with an
opening message and a ``step(reply)``, seeded, no network), a ``make_*`` function writing its
tasks as JSON lines (train and a held-out test split) and, if the model needs a warm-up, SFT
rows in a format the SFT reader takes (``messages`` for dialogues); a ``prepare_*`` function
building all of it next to a tiny model; a workflow in ``trinity/common/workflows/`` that
plays one task and returns experiences (multi-turn: one per episode, with
``trinity.common.workflows.multiturn.merge_turns``); an example config under ``examples/``; then
name the ``prepare_*`` function in ``DEMOS``. Keep the module's imports light: workflows
import the environment in every rollout process.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, Dict, Optional

# name -> "module:function"; imported on use, so listing demos loads no model code.
DEMOS: Dict[str, str] = {
    "arithmetic": "trinity.demo.synthetic:prepare_quickstart",
    "guess_number": "trinity.demo.guess_number:prepare_guess_number",
    "calculator": "trinity.demo.calculator:prepare_calculator",
    "smollm2": "trinity.demo.word_problems:prepare_smollm2",
}


def prepare_demo(name: str, root: str) -> Dict[str, str]:
    """Build demo ``name``'s tiny model and data under ``root``; return their paths."""
    if name not in DEMOS:
        raise KeyError(f"unknown demo '{name}'; choose one of {', '.join(sorted(DEMOS))}")
    module, function = DEMOS[name].split(":")
    return getattr(importlib.import_module(module), function)(root)


def read_marker(path: str) -> Optional[Dict[str, Any]]:
    """The arguments a demo's data was built with (its JSON marker), or None if not built."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


__all__ = ["DEMOS", "prepare_demo", "read_marker"]
