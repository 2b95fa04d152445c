"""Switching / offload policies: pure objects that turn events into intents.

- ``base``: the ``Policy`` protocol and the helpers every built-in shares (``train_or_publish``,
  ``load_on_ready``, ``validate_when_due``);
- ``separate``: the seed's behaviour — standalone replicas generate all the time;
- ``lend_when_idle``: hybrid replicas lent to rollout while the trainer waits, reclaimed when a
  batch is ready;
- ``colocated``: the synchronous baseline every async claim is measured against;
- ``registry``: policies by name — built-ins by key, others by ``"module:Class"`` — and import
  strings resolved where users keep their code;
- ``reference``: the policy reference of ``docs/policies.md`` (the view, ``Policy``, the helpers,
  the intents and events), written from the code.

Invariant: imports ``shunter.events`` only — no Ray, no torch, no vLLM — so a policy can
be written, tested and replayed against an event log anywhere. The names below are the public API.
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
