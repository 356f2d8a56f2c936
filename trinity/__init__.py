"""Trinity-RFT: reinforcement fine-tuning of LLMs.

From Python (a script, a notebook), a run is one call; it does what ``trinity run`` does,
with the same checks before anything starts::

    import trinity

    result = trinity.run("examples/quickstart/arithmetic.yaml", overrides=["buffer.total_steps=2"])
    print(result.job_dir, result.final_hf)

Packages, each importing only the ones listed after it (docs/design-notes.md, "Code
layout"; the layers contract in ``pyproject.toml``, checked by ``lint-imports``): ``cli``
(the command line),
``studio`` (the config page), ``runtime`` (Ray wiring, the one-process stage, the
``trinity run`` driver), ``preflight`` (derived values and every check before start),
``trainer`` and ``explorer``, ``algorithm`` (advantage/loss/KL/entropy/sampling components),
``buffer`` (tasksets, the experience queue), ``engine`` (rollout engines and their OpenAI
server), ``monitor``, ``ops`` (attention shared by engine and trainer), ``common`` (config
schema, experiences, registries, workflows, rewards, the ``ModelWrapper``), ``demo`` (tiny
models, synthetic tasks) and ``utils``.

``import trinity`` imports nothing else: ``run`` and the names below load what they need
when first used (the start of every process pays for this module).
"""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (7 ms) at every start
if TYPE_CHECKING:
    from typing import Any, Sequence

    from trinity.common.config.loader import ConfigSource
    from trinity.runtime.launcher import RunResult

# name -> module of the public names this module lends without importing them up front
_LAZY = {
    "ConfigError": "trinity.common.config.base",
    "RunFailed": "trinity.runtime.failures",
    "RunResult": "trinity.runtime.launcher",
    "PluginError": "trinity.utils.plugin_loader",
}


def run(
    config: ConfigSource, overrides: Sequence[str] = (), plugin_dirs: Sequence[str] = ()
) -> RunResult:
    """Run the experiment ``config`` describes (every stage), as ``trinity run`` does.

    ``config``: a YAML file's path, or its sections as a dict. ``overrides``: dotted
    ``key=value`` strings, as on the command line (``buffer.total_steps=2``). ``plugin_dirs``:
    folders of plugin modules (``--plugin-dir``). Hub ids in the config are resolved first,
    and every check runs before anything starts.

    Returns a ``RunResult``: ``job_dir`` (the last stage's output folder: resolved config,
    checkpoints, metrics, logs), ``final_hf`` (its final weights as a Hugging Face folder)
    and ``stages`` (each stage's). Raises ``ConfigError`` (a ``ValueError`` listing every
    problem of the config) or ``PluginError`` before anything starts, ``RunFailed`` when a
    role fails during the run.
    """
    from trinity.runtime.launcher import RunResult
    from trinity.runtime.launcher import run as run_stages

    return RunResult(run_stages(config, list(overrides), list(plugin_dirs)))


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trinity' has no attribute {name!r}")


__all__ = ["ConfigError", "PluginError", "RunFailed", "RunResult", "__version__", "run"]
