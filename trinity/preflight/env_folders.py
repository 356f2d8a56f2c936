"""A missing folder that a ``${oc.env:VAR,default}/...`` interpolation names, said once.

The examples read their model and data from the folder ``trinity prepare-quickstart`` wrote:
``${oc.env:TRINITY_QUICKSTART_DIR,./quickstart}/model``, ``.../data/rl``... Run from another
folder, or before preparing, every such path is missing, and each check would say so on a line
of its own. ``fold_missing_folders`` replaces those lines with one about the folder, naming
the variable and the keys that read from it; when the variable is a demo's
(``trinity.demo.DEMOS``), the line says which ``prepare-quickstart`` command builds it.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Dict, List, Optional, Tuple

from trinity.demo import DEMOS

_KEY = re.compile(r"[\w.\[\]]+")  # a problem starts with the key it is about


def fold_missing_folders(
    found: List[Tuple[str, str]], defaults: Dict[str, str]
) -> List[Tuple[str, str]]:
    """``found`` ((problem, stage label) pairs) with the problems about paths in a missing
    folder replaced by one problem per stage; ``defaults``: ``{VAR: default}`` of the config's
    ``${oc.env:VAR,default}/...`` paths (``loader.env_folder_defaults``)."""
    for variable, default in defaults.items():
        value = os.environ.get(variable)
        folder = os.path.abspath(default if value is None else value)
        if os.path.exists(folder):
            continue
        inside = [item for item in found if folder + os.sep in item[0]]
        if not inside:
            continue
        keys = list(dict.fromkeys(_key(problem) for problem, _ in inside))
        line = _missing_folder_line(variable, value, default, folder, keys)
        labels = list(dict.fromkeys(label for _, label in inside))
        found = [(line, label) for label in labels] + [i for i in found if i not in inside]
    return found


def _key(problem: str) -> str:
    match = _KEY.match(problem)
    return match.group(0) if match else problem


def _missing_folder_line(
    variable: str, value: Optional[str], default: str, folder: str, keys: List[str]
) -> str:
    if value is None:
        why = f"{variable} is not set: the config's default {default}"
    else:
        why = f"{variable} = {value}"
    said = f"no such folder {folder} ({why}), where the config reads {', '.join(keys)}"
    demo = next((name for name, d in DEMOS.items() if d.variable == variable), None)
    if demo is None:
        return said
    task = "" if demo == "arithmetic" else f" --task {demo}"
    out = shlex.quote(default if value is None else value)
    return (
        f"{said}; run `trinity prepare-quickstart{task} --out {out}` first, or set {variable} "
        "to the folder it wrote"
    )
