"""Continual-learning methods, one module each, registered by name in METHODS."""
from gcl.methods.base import METHODS, Method, MethodContext  # noqa: F401
from gcl.methods import er, joint, sgd  # noqa: F401  (registration)
