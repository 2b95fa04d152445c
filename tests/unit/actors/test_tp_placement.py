"""A tensor-parallel standalone replica's bundle of ``rollout.tensor_parallel_size`` GPUs lies on
one node: a cluster with no node that large is refused before anything is reserved, naming the
field (``actors.launch.placement.check_nodes``)."""

from __future__ import annotations

import pytest

from shunter.actors.launch.placement import PlacementError, check_nodes
from shunter.engine.config import from_dict
from shunter.engine.config.placement import plan


def _plan(tp: int):
    return plan(
        from_dict(
            {
                "trainer": {"num_gpus": 1},
                "rollout": {"standalone_replicas": 2, "num_gpus": 1, "tensor_parallel_size": tp},
            }
        )
    )


def test_a_bundle_of_tp_gpus_must_fit_a_node_of_the_cluster():
    nodes = [{"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0, "GPU": 2.0}]
    check_nodes(_plan(2), nodes)  # each replica's two GPUs on one node
    with pytest.raises(PlacementError, match=r"rollout.tensor_parallel_size = 4: .* the largest node .* has 2"):
        check_nodes(_plan(4), nodes)
