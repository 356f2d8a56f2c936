"""Run wiring: the roles, the synchronizer, stages and the ``trinity run`` driver.

Components (explorer, trainer, buffer) are plain classes; the roles (``trainer_role``,
``explorer_role``, ``queue_host``) wire them for a stage and reach each other with
``roles.call``, which works on a Ray actor and on a plain object alike. A stage runs in
``trinity run``'s own process (``local_stage.py``) or with each role a Ray actor
(``actors.py``, the one place components become actors; ``launcher.py``). A new mode is a
new wiring in both (``local_stage._LocalStage`` and ``launcher._Stage``), not new component
code; a role method another role calls must work through ``roles.call``.
"""
