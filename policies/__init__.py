"""Switching / offload policies: pure objects that turn events into commands.

Invariant: imports ``shunter.events`` only — no Ray, no torch, no vLLM — so a policy can
be written, tested and replayed against an event log anywhere.
"""

from shunter.policies.base import SAMPLE_EVENTS, Policy
from shunter.policies.colocated import ColocatedPolicy
from shunter.policies.lend_when_idle import LendWhenIdlePolicy
from shunter.policies.registry import BUILTIN, import_object, make_policy, policy_class
from shunter.policies.separate import SeparatePolicy

__all__ = [
    "BUILTIN",
    "SAMPLE_EVENTS",
    "ColocatedPolicy",
    "LendWhenIdlePolicy",
    "Policy",
    "SeparatePolicy",
    "import_object",
    "make_policy",
    "policy_class",
]
