"""``ENGINES``: each ``engine_type`` name and the engine class it stands for
(docs/design-notes.md, "Engines behind one registry, layers enforced").

Both hosts build an engine from here: the Ray ``EngineActor`` (``runtime/actors.py``) and the
in-process ``LocalEngine`` (``engine/local.py``), so an engine registered by a plugin runs
under either. ``explorer.rollout_model.engine_type`` and ``explorer.auxiliary_models[i].
engine_type`` are checked against these names before start.
"""

from __future__ import annotations

from trinity.common.registry import Registry

# Names only: an engine_type in a config is a registered name, never a dotted path.
ENGINES: Registry = Registry("engines")
# What an unset engine_type runs: the guide's default is vllm, an optional install here
# (docs/design-notes.md, "The default engine").
DEFAULT_ENGINE = "transformers"
