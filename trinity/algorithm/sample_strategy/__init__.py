"""Sample strategies (``algorithm.sample_strategy``).

To add one: subclass ``SampleStrategy``, take the reader and the keyword arguments you
need in ``__init__`` (keep ``**kwargs``: the trainer also passes ``auxiliary_readers``,
``group_size`` and ``max_response_tokens``), implement
``sample(step, batch_size) -> (experiences, metrics)``, give ``state_dict``/``load_state_dict``
if it keeps state, decorate it with ``@SAMPLE_STRATEGY.register_module("name")`` and import
the file below. A plugin (a ``--plugin-dir`` file) registers the same way; see
docs/extending.md.
"""

from trinity.algorithm.sample_strategy.base import SAMPLE_STRATEGY, SampleStrategy
from trinity.algorithm.sample_strategy.dapo import DAPOSampleStrategy
from trinity.algorithm.sample_strategy.default import DefaultSampleStrategy
from trinity.algorithm.sample_strategy.mix import MixSampleStrategy
from trinity.algorithm.sample_strategy.staleness import StalenessControlSampleStrategy
from trinity.algorithm.sample_strategy.warmup import WarmupSampleStrategy

__all__ = [
    "SAMPLE_STRATEGY",
    "SampleStrategy",
    "DAPOSampleStrategy",
    "DefaultSampleStrategy",
    "MixSampleStrategy",
    "StalenessControlSampleStrategy",
    "WarmupSampleStrategy",
]
