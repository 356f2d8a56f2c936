"""The shape of the package's own import graph, counted with ``ast``
(docs/design-notes.md, "Code layout")::

    python bench/import_graph.py [--root trinity] [--json OUT]

Counts every ``import trinity...`` / ``from trinity... import`` in ``trinity/`` (relative
imports resolved), module-level and function-local alike, grouped by top-level folder
(``trinity/<folder>/``; modules directly under ``trinity/`` are the folder ``trinity``):

  * ``mutual_pairs``: pairs of folders each importing the other (a cycle of two layers);
  * ``local_imports``: import statements of ``trinity`` modules inside a function body
    (mostly cycles dodged at import time), and ``local_third_party``: the others (the lazy
    imports of torch, transformers, ray... kept for start-up time: docs/performance.md);
  * ``upward_from_common``: the folders ``trinity/common`` imports.

It measures; it asserts nothing (``lint-imports`` enforces the layers).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple


def _folder(module: str) -> Optional[str]:
    parts = module.split(".")
    if parts[0] != "trinity":
        return None
    return parts[1] if len(parts) > 1 else "trinity"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> List[str]:
    """The absolute module names one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if not node.level:
        return [node.module or ""]
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return [".".join(base + ([node.module] if node.module else []))]


def _imports(tree: ast.AST) -> Iterator[Tuple[ast.AST, bool]]:
    """Each import statement with whether it sits inside a function."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[Tuple[ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from walk(child, inner)

    return walk(tree, False)


def measure(root: Path) -> Dict[str, object]:
    """The figures the module docstring describes, for the package at ``root``."""
    edges: Dict[str, Set[str]] = {}
    local = {"trinity": 0, "other": 0}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        source = _folder(module)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _imports(tree):
            names = _imported(node, module, path.name == "__init__.py")
            if in_function:
                local["trinity" if any(map(_folder, names)) else "other"] += 1
            for name in names:
                target = _folder(name)
                if source and target and target != source:
                    edges.setdefault(source, set()).add(target)
    pairs = sorted(
        f"{a}<->{b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, set())
    )
    return {
        "mutual_pairs": len(pairs),
        "pairs": pairs,
        "local_imports": local["trinity"],
        "local_third_party": local["other"],
        "upward_from_common": sorted(edges.get("common", set())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="trinity", type=Path)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    figures = measure(args.root.resolve())
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(
        f"{figures['mutual_pairs']} folder pairs import each other; "
        f"{figures['local_imports']} imports of trinity modules inside functions "
        f"({figures['local_third_party']} of other modules)"
    )


if __name__ == "__main__":
    main()
