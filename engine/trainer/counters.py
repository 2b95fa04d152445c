"""``TrainerCounters``: where the ``Trainer`` is — its optimizer steps, its published versions and
the steps taken since the last publish.

Invariants: ``version`` counts publishes (0 = the weights the run started from, which the
replicas also start from), so a sample's staleness at a step is ``version - min(versions)``;
``step`` counts optimizer steps; ``steps_since_publish`` is 0 right after a publish (and at the
start) and grows by one a step. Held by the ``Trainer`` (which saves and restores ``step`` and
``version`` in its checkpoints) and given to its ``Stepper`` (which advances ``step`` and
``steps_since_publish``) and its ``WeightPublisher`` (which advances ``version`` and resets
``steps_since_publish``): the one table the three share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerCounters:
    step: int = 0
    version: int = 0
    steps_since_publish: int = 0
