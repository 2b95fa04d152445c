"""The golden encodings of the example messages (``shunter.events.examples.CASES``, one
instance of every message type), committed under tests/golden/ and decoded in CI, so a change
that breaks the wire format fails loudly.

A new message type needs a case in ``events/examples.py``; regenerate with
``python -m tests.support.golden_cases --write`` (only for *new* tags — an existing golden file
must never change: a breaking change gets a new tag).

A message that only lost fields or gained fields with defaults is not a breaking change
(msgspec ignores unknown fields and fills in defaults): its old file stays as written,
``LEGACY`` says what the old bytes decode to now, and the new encoding is a revision
``<tag>@<n>.msgpack`` (``REVISIONS``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from shunter import events as e
from shunter.events.examples import CASES, ENV

GOLDEN = Path(__file__).parents[1] / "golden"

REVISIONS = {
    "replica.switch_to_rollout": 2,
    "trainer.train_step": 2,
    "rollout.load_weights": 2,
    "validate.run": 2,
    "run.resumed": 2,
    "trainer.publish_weights": 2,
    "trainer.publish": 2,
    "component.placed": 2,
    "trainer.weights_ready": 2,
}
"""Tags whose message lost fields (issue 13: intents carry nothing the coordinator fills in) or
gained optional ones (issue 14: ``RunResumed.skipped``; issue 28: ``PublishWeights.replica_ids``,
``Publish.deliver`` — weights straight to the replicas' relays; ``ComponentPlaced.node_id`` — hosts
that share an address told apart; ``WeightsReady.detail`` — the publish's parts)."""

LEGACY: dict[str, e.Message] = {
    "replica.switch_to_rollout": e.SwitchToRollout(replica_ids=["hybrid-1"], **ENV),
    "trainer.train_step": e.TrainStep(loss_fn="my.mod:loss", **ENV),
    "rollout.load_weights": e.LoadWeights(version=2, replica_ids=["standalone-0"], **ENV),
    "validate.run": e.Validate(replica_ids=["standalone-0"], **ENV),
    "run.resumed": e.RunResumed(
        checkpoint="runs/r/checkpoints/step-00000010", step=10, version=5, attempt=1, reason="trainer died", **ENV
    ),
    "trainer.publish_weights": e.PublishWeights(**ENV),
    "trainer.publish": e.Publish(**ENV),
    "component.placed": e.ComponentPlaced(component="standalone-0", bundle=1, node="10.0.0.1", gpu_ids=["1"], **ENV),
    "trainer.weights_ready": e.WeightsReady(
        version=2, handle="ray:2", transport="ray", nbytes=2_000_000, duration_s=0.01, **ENV
    ),
}
"""What the first golden file of a revised tag decodes to now (old event logs stay readable)."""


def path_for(msg: e.Message) -> Path:
    tag = e.tag_of(msg)
    rev = REVISIONS.get(tag)
    return GOLDEN / (f"{tag}@{rev}.msgpack" if rev else f"{tag}.msgpack")


def legacy_path(tag: str) -> Path:
    return GOLDEN / f"{tag}.msgpack"


if __name__ == "__main__" and "--write" in sys.argv:
    codec = e.Codec()
    for msg in CASES:
        p = path_for(msg)
        if p.exists():
            continue  # never rewrite an existing golden file
        p.write_bytes(codec.encode(msg))
        print("wrote", p)
