"""Trinity-RFT: reinforcement fine-tuning of LLMs.

Packages: ``common`` (config, experiences, workflows, rewards, models), ``algorithm``
(advantage/loss/KL/entropy/sampling components), ``buffer`` (tasksets, experience queue),
``explorer``, ``trainer``, ``monitor`` and ``runtime`` (Ray wiring and the ``trinity run`` driver).
"""

__version__ = "0.1.0"
