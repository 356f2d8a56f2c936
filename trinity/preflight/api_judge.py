"""A judge at an outside API that a taskset's ``workflow_args`` name becomes an external model.

A workflow whose class has ``api_judge(workflow_args)`` (``rubric_judge_openai_workflow``)
names its judge's API in its ``workflow_args`` rather than in ``explorer.auxiliary_models``,
as the original's configs do. ``derive_api_judge`` writes that API into the config as
``explorer.auxiliary_models[0]`` with ``engine_type: external``, and from there it is any
external model: its base-URL variable is checked before start, the launcher hands its
variables to the explorer, and each runner opens its client (``engine/external.py``). The
workflow could not open one itself: ``trinity.common`` sits below ``trinity.engine``.
"""

from __future__ import annotations

import logging
from typing import List, Tuple

from trinity.common.config.base import assign
from trinity.common.config.config import Config
from trinity.common.config.schema_buffer import StorageConfig
from trinity.common.config.schema_explorer import InferenceModelConfig
from trinity.common.config.schema_model import ExternalModelConfig
from trinity.preflight.components import origin_of, resolve_workflow
from trinity.preflight.validate import read_storages

logger = logging.getLogger("trinity.config")

AUX = "explorer.auxiliary_models"


def derive_api_judge(config: Config) -> List[str]:
    """Make the API judge that the tasksets' workflows name ``explorer.auxiliary_models[0]``;
    a problem when the tasksets name different APIs or the user set auxiliary models."""
    judges: List[Tuple[str, StorageConfig, ExternalModelConfig]] = []
    for path, storage in read_storages(config, ("tasksets", "eval_tasksets")):
        workflow, _ = resolve_workflow(config, path, storage)  # unknown names: reported later
        api_judge = getattr(workflow, "api_judge", None)
        judge = api_judge(storage.workflow_args) if api_judge else None
        if judge is not None:
            judges.append((path, storage, judge))
    if not judges:
        return []
    (path, storage, judge), *others = judges
    for other_path, _, other in others:
        if other != judge:
            return [
                f"{other_path}.workflow_args names the judge {_show(other)} and {path} names "
                f"{_show(judge)}: a run has one API judge ({AUX}[0]); name the same one"
            ]
    auxiliary = config.explorer.auxiliary_models
    if not auxiliary:
        entry = InferenceModelConfig(engine_type="external", external_model=judge)
        assign(config.explorer, "auxiliary_models", [entry])
        logger.info(
            "%s.workflow_args: the judge (%s) is %s[0], engine_type: external",
            path,
            _show(judge),
            AUX,
        )
        return []
    if auxiliary[0].engine_type == "external" and auxiliary[0].external_model == judge:
        return []  # a config this derivation wrote (a run's saved config) has it already
    key = origin_of(config, path, storage, "default_workflow_type")
    return [
        f"{AUX} is set, but {key} = {storage.default_workflow_type} puts its judge "
        f"({_show(judge)}, from {path}.workflow_args) at {AUX}[0]; remove {AUX}"
    ]


def _show(judge: ExternalModelConfig) -> str:
    return f"{judge.model_name} at ${judge.base_url_env}, key ${judge.api_key_env}"
