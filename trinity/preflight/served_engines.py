"""Engines the OpenAI-compatible server must serve, checked before start: the rollout model
with ``enable_openai_api`` or in mode serve, and every auxiliary model (workflows reach those
only through the API). An engine is served through its ``served_model(name)``; a plugin
engine without one is named here, not when its server would start (docs/extending.md)."""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

from trinity.common.config.config import Config
from trinity.engine import DEFAULT_ENGINE, ENGINES


def served_over_the_api(config: Config) -> Iterator[Tuple[str, Any, str]]:
    """(YAML path, section, why it is served) of each model the stage serves over the API."""
    if config.mode == "train":
        return
    rollout = config.explorer.rollout_model
    if config.mode == "serve":
        yield "explorer.rollout_model", rollout, "mode serve"
    elif rollout.enable_openai_api:
        yield "explorer.rollout_model", rollout, "enable_openai_api: true"
    for i, aux in enumerate(config.explorer.auxiliary_models):
        yield f"explorer.auxiliary_models[{i}]", aux, "an auxiliary model"


def served_engine_problems(config: Config) -> List[str]:
    """One line per served model whose engine has no ``served_model``."""
    problems = []
    for path, section, why in served_over_the_api(config):
        name = section.engine_type or DEFAULT_ENGINE
        if name not in ENGINES:  # an unknown name is reported by the support checks
            continue
        engine = ENGINES.get(name)
        if engine.hosted and not callable(getattr(engine, "served_model", None)):
            problems.append(
                f"{path}.engine_type = {name}: {why} serves it over the OpenAI-compatible API, "
                "but the engine has no served_model(name); add one (docs/extending.md, "
                '"Rollout engines") or use an engine that has it (transformers, vllm)'
            )
    return problems
