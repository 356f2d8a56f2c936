"""Import plugin modules from ``trinity/plugins`` and user ``--plugin-dir`` folders."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Iterable, List

DEFAULT_PLUGIN_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "plugins")


class PluginError(ImportError):
    pass


def load_plugins(plugin_dirs: Iterable[str] = ()) -> List[str]:
    """Import every ``*.py`` in the default and given folders once; returns the module names."""
    loaded = []
    for folder in [DEFAULT_PLUGIN_DIR, *plugin_dirs]:
        folder = os.path.abspath(folder)
        if not os.path.isdir(folder):
            raise PluginError(f"--plugin-dir {folder} is not a directory")
        tag = hashlib.sha1(folder.encode()).hexdigest()[:8]
        for file in sorted(os.listdir(folder)):
            if not file.endswith(".py") or file.startswith("_"):
                continue
            name = f"trinity_plugin_{tag}_{file[:-3]}"
            if name in sys.modules:
                continue
            path = os.path.join(folder, file)
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[name]
                raise PluginError(f"failed to import plugin {path}: {exc!r}") from exc
            loaded.append(name)
    return loaded
