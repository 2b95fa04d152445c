"""Finding policies by name: built-ins by registry key, others by ``"module:Class"``.

Invariant: code is imported only from a name the user wrote in the config — never from
event bytes and never by unpickling — and a bad name raises ``ValueError`` naming it.
Import strings resolve from ``run.import_paths`` first (the config file's folder and the
working directory, added by ``load_config``), then from installed packages.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from shunter.policies.base import Policy, checked_ignores
from shunter.policies.colocated import ColocatedPolicy
from shunter.policies.lend_when_idle import LendWhenIdlePolicy
from shunter.policies.separate import SeparatePolicy

BUILTIN: dict[str, type[Policy]] = {cls.name: cls for cls in (SeparatePolicy, LendWhenIdlePolicy, ColocatedPolicy)}

MOVED = {"shunter.engine.math_reward": "shunter.engine.tasks.math_reward"}
"""Modules the docs once showed in import strings -> where they live now (the engine's modules
moved into sub-packages by role): a config written against the old docs keeps working."""


def use_import_paths(paths: Sequence[str]) -> None:
    """Put ``paths`` first on ``sys.path`` for good (in an actor process of the run)."""
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)


@contextmanager
def import_paths(paths: Sequence[str]) -> Iterator[None]:
    """``paths`` first on ``sys.path`` while the block runs (in the user's own process)."""
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def _user_folders() -> str:
    """The folders on ``sys.path`` a user's module can be in: not the interpreter's or the venv's
    own (its ``bin``, ``site-packages``, what Ray adds there)."""
    own = tuple(dict.fromkeys((sys.prefix, sys.base_prefix, sys.exec_prefix)))
    folders = [p or os.getcwd() for p in sys.path]  # "": the working directory
    return ", ".join([p for p in dict.fromkeys(folders) if not p.startswith(own)][:6]) or "sys.path"


def import_object(spec: str, what: str) -> Any:
    """Import ``"package.module:attr"``; ValueError naming ``spec`` and the reason."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} spec {spec!r} must look like 'package.module:name'")
    module_name = MOVED.get(module_name, module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if (
            isinstance(e, ModuleNotFoundError)
            and e.name
            and e.name != module_name
            and not module_name.startswith(e.name + ".")
        ):
            raise ValueError(
                f"{what} spec {spec!r}: module {module_name!r} was found, but it imports {e.name!r}, "
                f"which is not installed ({e})"
            ) from e
        raise ValueError(
            f"{what} spec {spec!r}: cannot import module {module_name!r} ({e}; searched {_user_folders()} "
            "first — import strings resolve from the config file's folder and the working "
            "directory, then installed packages)"
        ) from e
    except Exception as e:  # noqa: BLE001 - the module itself raised while importing: the user's code
        raise ValueError(
            f"{what} spec {spec!r}: importing module {module_name!r} raised {type(e).__name__}: {e}"
        ) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{what} spec {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def policy_class(spec: str) -> type[Policy]:
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise ValueError(f"unknown policy {spec!r}: built-ins are {sorted(BUILTIN)}, or give 'module:Class'")
    cls = import_object(spec, "policy")
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ValueError(f"policy {spec!r} is not a subclass of shunter.policies.Policy")
    checked_ignores(cls)
    return cls


def make_policy(spec: str, options: dict[str, Any] | None = None) -> Policy:
    """An instance of the policy ``spec`` with ``options``; ValueError naming what is wrong."""
    cls = policy_class(spec)
    try:
        policy = cls(**(options or {}))
    except TypeError as e:
        raise ValueError(f"policy {spec!r}: bad run.policy_options {options!r}: {e}{_takes(cls)}") from None
    except Exception as e:  # noqa: BLE001 - the user's constructor raised
        raise ValueError(f"policy {spec!r}: {cls.__name__}(**{options or {}!r}) raised {type(e).__name__}: {e}") from e
    try:
        policy.snapshot()
    except Exception as e:  # noqa: BLE001 - a State that cannot be snapshot breaks every checkpoint
        raise ValueError(
            f"policy {spec!r}: {cls.__name__}.snapshot() fails ({type(e).__name__}: {e}); "
            "State must be a msgspec Struct of plain fields"
        ) from e
    return policy


def _takes(cls: type) -> str:
    """``" (it takes: a, b)"`` — the keyword options a policy's constructor names, if it names any."""
    import inspect

    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return ""
    names = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    return f" (it takes: {', '.join(names)})" if names else ""
