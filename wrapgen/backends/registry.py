"""Targets by name: `register_backend("mytarget", MyEmitter)` then `config.target = "mytarget"`."""

from __future__ import annotations

from wrapgen.backends.emitter import Emitter

_BACKENDS: dict[str, type[Emitter]] = {}


def register_backend(name: str, emitter: type[Emitter], *, override: bool = True) -> None:
    """Make `emitter` (an Emitter subclass) available as target `name`."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"backend name must be an identifier, got {name!r}")
    if not (isinstance(emitter, type) and issubclass(emitter, Emitter)):
        raise TypeError(f"backend {name!r} must be a subclass of wrapgen.backends.Emitter, got {emitter!r}")
    if not override and name in _BACKENDS:
        raise ValueError(f"backend {name!r} is already registered")
    _BACKENDS[name] = emitter


def get_backend(name: str) -> type[Emitter]:
    try:
        return _BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(_BACKENDS))
        raise ValueError(f"unknown target {name!r}; registered targets: {known}") from None


def registered_backends() -> list[str]:
    return sorted(_BACKENDS)
