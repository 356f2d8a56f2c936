"""What each optional extra adds to the base install, from the installed packages' own files.

For an extra, the distributions its requirements pull in (recursively, as installed in this
environment) that the base install (``project.dependencies``) does not, and the bytes of their
installed files. Run it in an environment where the extras are installed (``.[dev]``):

    python scripts/extra_sizes.py --extras verifiers openenv textarena reasoning_gym \
        --out docs/results/extra_sizes.json
"""

from __future__ import annotations

import argparse
import json
import os
from importlib import metadata
from typing import Dict, Iterable, List, Set

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _closure(requirements: Iterable[str]) -> Set[str]:
    """The installed distributions these requirements reach (markers for this interpreter)."""
    seen: Set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here
        seen.add(name)
        for sub in dist.requires or []:
            subreq = Requirement(sub)
            if not subreq.marker or subreq.marker.evaluate({"extra": ""}):
                todo.append(subreq)
    return seen


def _bytes(name: str) -> int:
    dist = metadata.distribution(name)
    total = 0
    for file in dist.files or []:
        path = dist.locate_file(file)
        if os.path.isfile(path):
            total += os.path.getsize(path)
    return total


def sizes(extras: List[str]) -> Dict[str, Dict]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    base = _closure(project["dependencies"])
    found = {}
    for extra in extras:
        added = sorted(_closure(project["optional-dependencies"][extra]) - base)
        each = {name: _bytes(name) for name in added}
        found[extra] = {
            "megabytes": round(sum(each.values()) / 1e6, 1),
            "distributions": {n: round(b / 1e6, 2) for n, b in sorted(each.items())},
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", nargs="+", required=True)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    found = sizes(args.extras)
    for extra, figure in found.items():
        print(f"{extra}: {figure['megabytes']} MB, {len(figure['distributions'])} distributions")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(found, handle, indent=2)


if __name__ == "__main__":
    main()
