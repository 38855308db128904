"""Continual-learning methods, one module each, registered by name in METHODS.

Every module of this package is imported here, so a new method only needs its own file
and the @register decorator.
"""
import importlib
import pkgutil

from gcl.methods.base import METHODS, Method, MethodContext  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")
