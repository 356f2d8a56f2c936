"""Trinity-RFT: reinforcement fine-tuning of LLMs.

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
"""

__version__ = "0.1.0"
