"""Run wiring: Ray actors, the synchronizer, stages and the ``trinity run`` driver.

Components (explorer, trainer, buffer) are plain classes; this package is the one place
that turns them into Ray actors (``actors.py``) and connects them for a mode (``launcher.py``).
A new mode is a new wiring in ``launcher.run_stage``, not new component code.
"""
