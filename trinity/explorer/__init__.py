"""The explorer: turns tasks into experiences with workflow runners and rollout engines.

``Explorer`` drives steps (read tasks, run them, write experiences, evaluate);
``WorkflowRunner`` runs one task at a time with retries; ``pool.RunnerPool`` spreads a step's
tasks over runners (Ray actors or threads of this process) with time limits. New behaviour
for a task type belongs in a Workflow (``trinity.common.workflows``), not here; a new kind of
runner implements ``pool.Runner``.
"""
