"""Hub ids in a stage's config, resolved to local folders before anything reads them.

Every key that names a model, a tokenizer, an adapter or a dataset may hold a Hugging Face
hub id (``ORG/NAME``, optionally ``@REVISION``) instead of a local path
(``trinity/utils/hub.py`` says what reads as one; a local path of the same name wins).
``HubIds.resolve_stage`` replaces each such value in a stage's config by the snapshot folder
``huggingface_hub`` resolves it to, downloading it unless offline, so that the checks, the
resolved ``config.yaml`` and every role (also on Ray workers) read one local folder. Each
distinct id is resolved once per run, however many keys and stages name it.

Keys: ``model.model_path`` (a tokenizer only when an external API is the rollout model),
``model.critic_model_path`` (algorithms with a critic), ``explorer.rollout_model.model_path``,
``explorer.auxiliary_models[i].model_path`` (local engines; an external one's is an API
name), ``model.lora_configs[i].path`` (a peft adapter), ``model.chat_template_path`` (a
tokenizer whose chat template is used; a ``.jinja`` file stays a file), and the ``path`` of
each dataset the stage reads from a storage kind with ``hub_datasets`` (tasksets, eval
tasksets, SFT/DPO data), with ``data_processor.task_pipeline.inputs``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Tuple, Union

from trinity.buffer.storages import STORAGES, storage_kind
from trinity.common.config.base import assign, set_default
from trinity.common.config.config import Config, external_models
from trinity.preflight.support import algorithm_class
from trinity.preflight.validate import read_storages
from trinity.utils.hub import HubError, HubRef, hub_ref, resolve

logger = logging.getLogger("trinity.config")

MODEL, TOKENIZER, ADAPTER, DATASET = "model", "tokenizer", "adapter", "dataset"
_EXPLORING = ("both", "colocate", "explore", "bench")


@dataclass
class _Named:
    """One config value that may be a hub id: its key, value, what it names, and how the
    resolved folder is written back."""

    key: str
    value: str
    kind: str  # MODEL, TOKENIZER, ADAPTER or DATASET
    put: Callable[[str], None]
    owner: str = ""  # whose other problems repeat this one's (a dataset's storage); unset: key

    @property
    def repo_type(self) -> str:
        """The kind of hub repository it names: a dataset's, or a model's."""
        return DATASET if self.kind == DATASET else MODEL


@dataclass
class HubIds:
    """Resolves the hub ids of a run's stages, each distinct one once.

    ``download``: fetch what the cache lacks (``trinity run``); false reads the cache only
    (the config studio checks as the user types: it must not start a download).
    """

    download: bool = True
    _done: Dict[Tuple[str, str], Union[str, HubError]] = field(default_factory=dict)

    def resolve_stage(
        self, config: Config, model_from_previous: bool
    ) -> Tuple[List[str], List[str]]:
        """Write the local folder of every hub id ``config`` names in place of the id.

        Returns (problems, the keys whose id did not resolve): the other checks' lines about
        those keys would only repeat the problem, so the caller drops them."""
        problems: List[str] = []
        failed: List[str] = []
        for named in _named_values(config, model_from_previous):
            ref = hub_ref(named.value, named.repo_type)
            if ref is None:
                continue
            memo = (named.kind, named.value)
            if memo not in self._done:
                self._done[memo] = self._resolve(named, ref)
            outcome = self._done[memo]
            if isinstance(outcome, HubError):
                failed.append(named.owner or named.key)
                line = str(outcome)  # said once, at the first key that names the id
                problems += [] if line in problems else [line]
                continue
            named.put(outcome)
        return problems, failed

    def _resolve(self, named: _Named, ref: HubRef) -> Union[str, HubError]:
        try:
            folder = resolve(named.key, named.value, ref, download=self.download, what=named.kind)
        except HubError as exc:
            return exc
        logger.info("%s = %s: the hub's %s, read from %s", named.key, named.value, ref, folder)
        return folder


def hub_keys(config: Config, model_from_previous: bool) -> List[str]:
    """The keys ``resolve_stage`` would resolve, found without resolving anything (for a
    stage not worth a download: its lines about them would only repeat that it is a hub id)."""
    named = _named_values(config, model_from_previous)
    return [n.owner or n.key for n in named if hub_ref(n.value, n.repo_type) is not None]


def _named_values(config: Config, model_from_previous: bool) -> List[_Named]:
    return _model_values(config, model_from_previous) + _dataset_values(config)


def _setter(section: Any, name: str) -> Callable[[str], None]:
    return lambda folder: assign(section, name, folder)


def _model_setter(config: Config) -> Callable[[str], None]:
    """``model.model_path``'s folder in place of its id; a Tinker run's id also names the
    service's base model (``model.tinker.base_model``, unless set)."""
    model = config.model

    def put(folder: str) -> None:
        if model.tinker.enable:
            set_default(model.tinker, "base_model", model.model_path)
        assign(model, "model_path", folder)

    return put


def _model_values(config: Config, model_from_previous: bool) -> List[_Named]:
    model, explorer = config.model, config.explorer
    external = {
        id(served)
        for _, _, served, api in external_models(config)
        if served.engine_type == "external" or api.enable
    }
    rollout = explorer.rollout_model
    found: List[_Named] = []
    if not model_from_previous and model.model_path:
        # with an external rollout model (explore mode) or Tinker only its tokenizer is read
        kind = TOKENIZER if id(rollout) in external or model.tinker.enable else MODEL
        found.append(_Named("model.model_path", model.model_path, kind, _model_setter(config)))
    algorithm_cls = algorithm_class(config)
    if model.critic_model_path and getattr(algorithm_cls, "use_critic", False):
        if config.mode != "explore":
            put = _setter(model, "critic_model_path")
            found.append(_Named("model.critic_model_path", model.critic_model_path, MODEL, put))
    if rollout.model_path and id(rollout) not in external and config.mode in _EXPLORING:
        put = _setter(rollout, "model_path")
        found.append(_Named("explorer.rollout_model.model_path", rollout.model_path, MODEL, put))
    for index, aux in enumerate(explorer.auxiliary_models):
        if aux.model_path and id(aux) not in external:
            key = f"explorer.auxiliary_models[{index}].model_path"
            found.append(_Named(key, aux.model_path, MODEL, _setter(aux, "model_path")))
    # A Tinker run ignores model.lora_configs (derive.py drops them): nothing to fetch.
    for index, entry in enumerate([] if model.tinker.enable else model.lora_configs or []):
        if entry.path:
            key = f"model.lora_configs[{index}].path"
            found.append(_Named(key, entry.path, ADAPTER, _setter(entry, "path")))
    if model.chat_template_path:
        put = _setter(model, "chat_template_path")
        found.append(_Named("model.chat_template_path", model.chat_template_path, TOKENIZER, put))
    return found


def _dataset_values(config: Config) -> List[_Named]:
    kinds = ("tasksets", "eval_tasksets", "experience_buffer", "auxiliary_buffers")
    found = []
    for key, storage in read_storages(config, kinds):
        if storage.path and _hub_datasets(storage):
            put = _setter(storage, "path")
            found.append(_Named(f"{key}.path", storage.path, DATASET, put, owner=key))
    pipeline = config.data_processor.task_pipeline
    tasksets = config.buffer.explorer_input.tasksets
    if pipeline is not None and tasksets and _hub_datasets(tasksets[0]):
        for index, path in enumerate(pipeline.inputs or []):
            key = f"data_processor.task_pipeline.inputs[{index}]"
            found.append(_Named(key, path, DATASET, _list_setter(pipeline.inputs, index)))
    return found


def _hub_datasets(storage: Any) -> bool:
    """Whether the storage's kind reads hub datasets (an unknown kind, reported, does not)."""
    return storage.storage_type in STORAGES and storage_kind(storage).hub_datasets


def _list_setter(items: List[str], index: int) -> Callable[[str], None]:
    def put(folder: str) -> None:
        items[index] = folder

    return put
