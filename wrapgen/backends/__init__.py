"""Targets: emitters that print a Wrapper IR program for one runtime, and their registry."""

from wrapgen.backends.cpp import CppEmitter
from wrapgen.backends.devices import DeviceOverrides, device_overrides, register_device_overrides
from wrapgen.backends.emitter import CompiledArtifact, Emitter
from wrapgen.backends.fx import FxEmitter
from wrapgen.backends.interpret import InterpretEmitter
from wrapgen.backends.python import PythonEmitter
from wrapgen.backends.registry import get_backend, register_backend, registered_backends

register_backend("python", PythonEmitter)
register_backend("fx", FxEmitter)
register_backend("cpp", CppEmitter)
register_backend("interpret", InterpretEmitter)

__all__ = [
    "CompiledArtifact",
    "CppEmitter",
    "DeviceOverrides",
    "Emitter",
    "FxEmitter",
    "InterpretEmitter",
    "PythonEmitter",
    "device_overrides",
    "get_backend",
    "register_backend",
    "register_device_overrides",
    "registered_backends",
]
