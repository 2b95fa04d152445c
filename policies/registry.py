"""Finding policies by name: built-ins by registry key, others by ``"module:Class"``.

Invariant: code is imported only from a name the user wrote in the config — never from
event bytes and never by unpickling — and a bad name raises ``ValueError`` naming it.
"""

from __future__ import annotations

import importlib
from typing import Any

from shunter.policies.base import Policy
from shunter.policies.colocated import ColocatedPolicy
from shunter.policies.lend_when_idle import LendWhenIdlePolicy
from shunter.policies.separate import SeparatePolicy

BUILTIN: dict[str, type[Policy]] = {
    cls.name: cls for cls in (SeparatePolicy, LendWhenIdlePolicy, ColocatedPolicy)
}


def import_object(spec: str, what: str) -> Any:
    """Import ``"package.module:attr"``; ValueError naming ``spec`` and the reason."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} spec {spec!r} must look like 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} spec {spec!r}: cannot import module {module_name!r} ({e})") from e
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
    return cls


def make_policy(spec: str, options: dict[str, Any] | None = None) -> Policy:
    cls = policy_class(spec)
    try:
        return cls(**(options or {}))
    except TypeError as e:
        raise ValueError(f"policy {spec!r}: bad run.policy_options {options!r}: {e}") from None
