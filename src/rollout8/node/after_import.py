"""Run a function on a module right after it has been imported (executed), before anything else can use it.

A module that is already imported gets the function at once. Used where rollout8 must wrap upstream code that
cannot be imported at the point our hooks are installed (verl's workers while `verl/__init__.py` is still running,
for instance), and by the simulated tier's CPU bridges. One finder per process serves every caller; each function
runs once per (module, name).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

_HOOKS: dict[str, list[tuple[str, Callable]]] = {}
_DONE: set[tuple[str, str]] = set()


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKS:
            return None
        sys.meta_path.remove(self)  # find the real spec without ourselves
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_hook(module):
            exec_module(module)
            _run(fullname, module)

        spec.loader.exec_module = exec_and_hook
        return spec


def _run(module_name: str, module) -> None:
    for name, fn in list(_HOOKS.get(module_name, ())):
        if (module_name, name) not in _DONE:
            _DONE.add((module_name, name))
            fn(module)


def register(module_name: str, name: str, fn: Callable) -> None:
    """Call fn(module) once, when `module_name` has been imported (now, if it already is)."""
    _HOOKS.setdefault(module_name, []).append((name, fn))
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    if module_name in sys.modules:
        _run(module_name, sys.modules[module_name])


def applied(module_name: str, name: str) -> bool:
    return (module_name, name) in _DONE
