"""Name -> class registries: the one layer of indirection (docs/design-notes.md, "Principles").

Register with the decorator, look up by the registered name or by a dotted
``module.Class`` path (so a config can name a class that was never registered).

A dotted path comes from a config file, so it may only name a subclass of the registry's
base type (``Workflow`` for workflows, ``RewardFn`` for rewards, ...): otherwise a config
line such as ``default_reward_fn_type: subprocess.Popen`` would call any importable object.
Registered names are code the user chose to import (built-ins or ``--plugin-dir`` modules)
and are returned as registered.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Dict, Generic, Iterator, Optional, TypeVar

from trinity.common.original_names import not_here
from trinity.utils.suggest import did_you_mean

T = TypeVar("T")
logger = logging.getLogger(__name__)


def plugin_hint(dotted: bool) -> str:
    """How a plugin's class becomes a name a config can use: the end of every message about
    a name no registry has (``dotted``: the registry also takes ``module.Class`` paths)."""
    hint = "a plugin's class is registered once its file is loaded with --plugin-dir"
    return hint + (", or it is named by its dotted path (module.Class)" if dotted else "")


def _builtin(obj: object) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] == "trinity"


class Registry(Generic[T]):
    """A named mapping from string keys to classes (or functions).

    ``base`` returns the class a dotted path must subclass; it is a function, called at the
    first dotted lookup, so a registry can be created above its base class in a module
    (``Registry("workflows", base=lambda: Workflow)``). Without it, only registered names
    resolve.
    """

    def __init__(self, name: str, base: Optional[Callable[[], type]] = None) -> None:
        self.name = name
        self._base = base
        self._modules: Dict[str, T] = {}

    def register_module(self, name: str, module: Optional[T] = None, force: bool = False) -> Any:
        """Register ``module`` under ``name``; usable as ``@REG.register_module("x")``.

        A second registration of a taken name is refused unless ``force`` is set or a
        plugin (code outside the ``trinity`` package) replaces a built-in, so two plugins
        cannot silently shadow each other.
        """

        def _register(obj: T) -> T:
            existing = self._modules.get(name)
            if existing is not None and existing is not obj and not force:
                if not (_builtin(existing) and not _builtin(obj)):
                    raise KeyError(
                        f"{self.name} already has a module named '{name}' "
                        f"({existing!r}); choose another name"
                    )
                # A plugin may replace a built-in of the same name (the developer guide's
                # OPMD example registers "opmd"); two plugins may not shadow each other.
                logger.warning("%s: plugin %r replaces built-in '%s'", self.name, obj, name)
            self._modules[name] = obj
            return obj

        if module is not None:
            return _register(module)
        return _register

    def get(self, name: str) -> T:
        """The module registered as ``name``, or the object at dotted path ``name``."""
        if name in self._modules:
            return self._modules[name]
        why = not_here(self.name, name)  # one of the original's names that needs more
        if why is not None:
            raise KeyError(why)
        if "." not in name:
            what = f"{self.name} has no module named '{name}'"
        elif self._base is not None:
            return self._import(name)
        else:
            what = (
                f"{self.name}: '{name}' is not a registered name, and this registry takes no "
                "dotted paths"
            )
        raise KeyError(self._unknown(what, name))

    def _unknown(self, what: str, name: str) -> str:
        """``what`` (a lookup of ``name`` failed), then the closest registered name, the
        known ones, and how a plugin's class gets here: one message for every registry."""
        known = ", ".join(sorted(self._modules)) or "none"
        hint = did_you_mean(name, self._modules)
        return f"{what}{hint} (known: {known}); {plugin_hint(self._base is not None)}"

    def _import(self, name: str) -> T:
        """The class at dotted path ``name``, if it subclasses the registry's base."""
        base = self._base()
        module_path, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module_path), attr)
        except (ImportError, AttributeError) as exc:
            what = f"{self.name}: cannot import '{name}' ({exc})"
            raise KeyError(self._unknown(what, name)) from exc
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise KeyError(
                f"{self.name}: '{name}' is not a {base.__name__} subclass; register plugins "
                f"in a --plugin-dir module or name a {base.__name__} subclass"
            )
        return obj

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._modules))

    def names(self) -> list:
        return sorted(self._modules)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {self.names()})"
