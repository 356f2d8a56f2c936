"""Every package a bench/ script imports is installed by the base dependencies or by the extra
its docstring names (``pip install -e ".[bench]"``): run from a ``[cpu]`` install plus that
extra, no script stops at an import. Imports inside functions count too: they run."""

import ast
import functools
import importlib.metadata
import os
import re
import sys
from typing import Dict, List, Set

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")
SCRIPTS = sorted(
    os.path.relpath(os.path.join(folder, name), ROOT)
    for folder, _, names in os.walk(BENCH)
    for name in names
    if name.endswith(".py")
)
# bench scripts import each other by module name (sys.path holds bench/) or as bench.<name>
OWN = {"bench", "trinity"} | {os.path.splitext(os.path.basename(s))[0] for s in SCRIPTS}
EXTRA_NAMED = re.compile(r'pip install -e "\.\[([\w,-]+)\]"')


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))


def declared(extras: List[str]) -> Set[str]:
    """Distributions the base dependencies and ``extras`` install (an extra naming the project
    itself, trinity-rft[cpu], brings that extra's)."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    names, todo, seen = set(), list(extras), set()
    requirements = list(project["dependencies"])
    while requirements or todo:
        if todo:
            extra = todo.pop()
            if extra not in seen:
                seen.add(extra)
                requirements += project["optional-dependencies"][extra]
            continue
        requirement = requirements.pop()
        own = re.match(r"trinity-rft\[([\w,-]+)\]", requirement)
        if own:
            todo += own.group(1).split(",")
        else:
            names.add(requirement_name(requirement))
    return names


def third_party_imports(path: str) -> Set[str]:
    """Top-level names of the modules ``path`` imports anywhere, stdlib and its own left out."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in OWN}


def named_extras(path: str) -> List[str]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        docstring = ast.get_docstring(ast.parse(f.read())) or ""
    return [e for match in EXTRA_NAMED.findall(docstring) for e in match.split(",")]


@functools.lru_cache(maxsize=1)
def installed() -> Dict[str, List[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> Set[str]:
    """The installed distributions providing ``module``; not installed: its own name."""
    found = installed().get(module) or [module]
    return {normalized(d) for d in found}


def test_the_scripts_are_found():
    assert "bench/serve_load.py" in SCRIPTS and "bench/trl_grpo.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_import_is_declared_by_the_base_or_the_named_extra(script):
    extras = named_extras(script)
    allowed = declared(extras)
    missing = {
        module: sorted(distributions(module))
        for module in third_party_imports(script)
        if not distributions(module) & allowed
    }
    assert not missing, (
        f"{script} imports {missing}, which neither the base dependencies nor the extras its "
        f"docstring names ({extras or 'none'}) declare; add it to an extra in pyproject.toml "
        'and name that extra in the docstring (pip install -e ".[NAME]")'
    )


def test_an_import_outside_the_declared_ones_is_caught():
    """serve_load.py imports httpx: without the bench extra it would be missing."""
    assert "httpx" in third_party_imports("bench/serve_load.py")
    assert "bench" in named_extras("bench/serve_load.py")
    assert not distributions("httpx") & declared([])
    assert distributions("httpx") & declared(["bench"])
