"""Storage names that must differ: what a name keys depends on where the storage sits."""

from __future__ import annotations

from typing import Dict, List, Tuple

# What a storage's name keys, by where it sits: a name may repeat across these (the
# original's FrozenLake config names its training and eval taskset alike), not within one.
_NAME_KEYS = {
    "buffer.explorer_input.tasksets": "training tasksets are told apart by name (the task "
    "selector's feedback and resume state)",
    "buffer.explorer_input.eval_tasksets": "eval tasksets are told apart by name (their "
    "eval/<name>/ metrics)",
    "buffer.trainer_input": "buffers are told apart by name (a buffer's default database "
    "file is <name>.db in the job folder)",
}


def name_problem(path: str, name: str, seen: Dict[Tuple[str, str], str]) -> List[str]:
    """The storage at ``path`` names ``name`` as another of its kind did (recorded in ``seen``)."""
    kind = next(k for k in _NAME_KEYS if path.startswith(k))
    other = seen.setdefault((kind, name), path)
    if other == path:
        return []
    return [f"{path}.name = {name} is also used by {other}: {_NAME_KEYS[kind]}; rename one"]
