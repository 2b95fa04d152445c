"""The placement plan (``engine.config.placement``): trainer bundle first, hybrids inside it,
one GPU bundle per standalone replica; configs that cannot fit are refused by name."""

from __future__ import annotations

import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.config.placement import Slot, plan


def cfg(trainer=None, rollout=None):
    return from_dict({"trainer": trainer or {}, "rollout": rollout or {}})


def test_a_cpu_config_has_no_plan():
    assert plan(cfg()) is None


def test_separate_on_two_gpus_gives_the_trainer_and_the_replica_a_gpu_each():
    p = plan(cfg({"num_gpus": 1, "num_cpus": 2}, {"standalone_replicas": 1, "num_gpus": 1, "num_cpus": 1}))
    assert p.bundles == [{"GPU": 1.0, "CPU": 2.0}, {"GPU": 1.0, "CPU": 1.0}]
    assert p.trainer == Slot(0, 1.0, 2.0) and p.standalone == [Slot(1, 1.0, 1.0)] and p.hybrid == []
    assert p.gpus == 2


def test_hybrid_replicas_share_the_trainers_bundle_and_standalone_ones_get_their_own():
    p = plan(
        cfg(
            {"num_gpus": 0.5, "num_cpus": 1},
            {"standalone_replicas": 2, "hybrid_replicas": 1, "num_gpus": 0.4, "num_cpus": 0.5},
        )
    )
    assert p.bundles[0] == {"GPU": 1.0, "CPU": 1.5}
    assert p.hybrid == [Slot(0, 0.4, 0.5)]
    assert [s.bundle for s in p.standalone] == [1, 2] and p.gpus == 3


def test_on_one_gpu_standalone_replicas_can_share_the_trainers_bundle():
    p = plan(
        cfg(
            {"num_gpus": 0.3},
            {"standalone_replicas": 1, "hybrid_replicas": 1, "num_gpus": 0.3, "share_trainer_gpu": True},
        )
    )
    assert p.gpus == 1 and [s.bundle for s in p.standalone + p.hybrid] == [0, 0]
    with pytest.raises(ConfigError, match="2 hybrid and standalone replicas x rollout.num_gpus"):
        cfg(
            {"num_gpus": 0.5},
            {"standalone_replicas": 1, "hybrid_replicas": 1, "num_gpus": 0.3, "share_trainer_gpu": True},
        )


def test_a_trainer_side_of_two_gpus_spreads_hybrid_replicas_over_both():
    c = from_dict(
        {
            "run": {"policy": "colocated"},
            "trainer": {"num_gpus": 0.5, "gpus": 2},
            "rollout": {"hybrid_replicas": 2, "standalone_replicas": 0, "num_gpus": 0.4, "max_staleness": 0},
        }
    )
    p = plan(c)
    assert p.gpus == 2 and [s.bundle for s in p.hybrid] == [0, 1] and p.trainer.bundle == 0


@pytest.mark.parametrize(
    ("trainer", "rollout", "match"),
    [
        ({"num_gpus": 0.6}, {"hybrid_replicas": 1, "standalone_replicas": 0, "num_gpus": 0.5}, "lower the fractions"),
        ({"num_gpus": 2}, {"num_gpus": 1}, r"<= 1.0 - at `\$.trainer.num_gpus`"),
        ({"num_gpus": 0}, {"num_gpus": 1}, "give the trainer a GPU"),
        ({"num_gpus": 1}, {"num_gpus": 0}, "give each replica a GPU"),
        ({"num_gpus": 1}, {"num_gpus": 2}, "a replica over several GPUs is rollout.tensor_parallel_size"),
        (
            {"num_gpus": 0.5, "gpus": 3},
            {"hybrid_replicas": 1, "standalone_replicas": 0, "num_gpus": 0.4, "tensor_parallel_size": 2},
            r"max\(trainer.gpus, trainer.world_size\) = 3\) are not a multiple of rollout.tensor_parallel_size \(2\)",
        ),
        (
            {"num_gpus": 0.5},
            {"standalone_replicas": 1, "num_gpus": 0.4, "share_trainer_gpu": True, "tensor_parallel_size": 2},
            "rollout.share_trainer_gpu with rollout.tensor_parallel_size = 2",
        ),
        (
            {"num_gpus": 0.5},
            {
                "hybrid_replicas": 0,
                "standalone_replicas": 1,
                "num_gpus": 0.5,
                "share_trainer_gpu": True,
                "max_staleness": 1,
            },
            None,
        ),
    ],
)
def test_configs_that_do_not_fit_are_refused_by_name_when_loaded(trainer, rollout, match):
    if match is None:  # the edge that fits
        assert plan(cfg(trainer, rollout)).gpus == 1
        return
    with pytest.raises(ConfigError, match=match):
        cfg(trainer, rollout)


def test_a_tensor_parallel_standalone_replica_holds_one_bundle_of_its_gpus_and_its_actor_takes_them_all():
    p = plan(
        cfg(
            {"num_gpus": 1, "num_cpus": 1},
            {"standalone_replicas": 2, "num_gpus": 1, "num_cpus": 0.5, "tensor_parallel_size": 2},
        )
    )
    assert p.bundles == [{"GPU": 1.0, "CPU": 1.0}, {"GPU": 2.0, "CPU": 0.5}, {"GPU": 2.0, "CPU": 0.5}]
    assert p.standalone == [Slot(1, 2.0, 0.5, gpus=2), Slot(2, 2.0, 0.5, gpus=2)] and p.gpus == 5
    assert [b for b, _ in p.groups()] == [p.bundles[:1], p.bundles[1:]]


def test_tensor_parallel_hybrid_replicas_span_consecutive_trainer_gpus_round_robin():
    c = from_dict(
        {
            "run": {"policy": "colocated"},
            "trainer": {"num_gpus": 0.3, "gpus": 4},
            "rollout": {
                "hybrid_replicas": 4,
                "standalone_replicas": 0,
                "num_gpus": 0.3,
                "max_staleness": 0,
                "tensor_parallel_size": 2,
            },
        }
    )
    p = plan(c)
    assert [(s.bundle, s.gpus, s.num_gpus) for s in p.hybrid] == [(0, 2, 0.3), (2, 2, 0.3), (0, 2, 0.3), (2, 2, 0.3)]
    assert p.bundles == [{"GPU": 1.0, "CPU": 2.0}] + [{"GPU": 1.0, "CPU": 1.0}] * 3
    # one span of two GPUs holding both replicas: 0.3 + 2 x 0.6 on GPU 0 does not fit
    with pytest.raises(ConfigError, match=r"trainer-side GPU 0: .* 2 hybrid replicas x rollout.num_gpus \(0.6\)"):
        from_dict(
            {
                "run": {"policy": "colocated"},
                "trainer": {"num_gpus": 0.3, "gpus": 2},
                "rollout": {
                    "hybrid_replicas": 2,
                    "standalone_replicas": 0,
                    "num_gpus": 0.6,
                    "max_staleness": 0,
                    "tensor_parallel_size": 2,
                },
            }
        )


def test_a_tensor_parallel_replica_asks_the_cluster_for_its_gpus():
    from shunter.engine.config.placement import replica_gpus

    r = cfg({"num_gpus": 1}, {"num_gpus": 0.5, "tensor_parallel_size": 2}).rollout
    assert replica_gpus(r, standalone=True) == 2.0 and replica_gpus(r, standalone=False) == 0.5
    assert replica_gpus(cfg(rollout={"tensor_parallel_size": 2}).rollout, standalone=True) == 0.0  # CPU


def test_custom_resources_pick_the_nodes_the_trainer_side_on_one_node_the_replicas_spread():
    """Issue 28: ``trainer.resources`` ride in the trainer's bundle, ``rollout.resources`` in each
    standalone replica's; the trainer's side is one group laid on one node (``STRICT_PACK``), the
    replicas' another, laid by ``rollout.placement_strategy``."""
    p = plan(
        cfg(
            {"num_gpus": 0.5, "num_cpus": 1, "resources": {"node_a": 1}},
            {"standalone_replicas": 2, "hybrid_replicas": 1, "num_gpus": 0.4, "num_cpus": 0.5,
             "resources": {"node_b": 0.5}, "placement_strategy": "STRICT_SPREAD"},
        )
    )  # fmt: skip
    assert p.bundles[0] == {"GPU": 1.0, "CPU": 1.5, "node_a": 1.0}
    assert p.bundles[1:] == [{"GPU": 1.0, "CPU": 0.5, "node_b": 0.5}] * 2
    (side, s1), (rest, s2) = p.groups()
    assert (side, s1) == ([p.bundles[0]], "STRICT_PACK") and (rest, s2) == (p.bundles[1:], "STRICT_SPREAD")
    assert [p.locate(s.bundle) for s in p.standalone] == [(1, 0), (1, 1)] and p.locate(p.trainer.bundle) == (0, 0)


def test_replicas_sharing_the_trainers_gpu_make_one_group():
    p = plan(
        cfg(
            {"num_gpus": 0.3},
            {"standalone_replicas": 2, "num_gpus": 0.3, "share_trainer_gpu": True, "resources": {"x": 1}},
        )
    )
    assert [g for _, g in p.groups()] == ["STRICT_PACK"] and p.bundles == [{"GPU": 1.0, "CPU": 2.0, "x": 2.0}]


@pytest.mark.parametrize(
    ("section", "resources", "match"),
    [
        ("trainer", {"node_a": 0}, "trainer.resources: node_a = 0"),
        ("rollout", {"GPU": 1}, "rollout.resources: GPU = 1 .* num_cpus / num_gpus"),
        ("rollout", {"node_b": -1}, "above 0"),
    ],
)
def test_custom_resources_that_name_no_node_or_no_amount_are_refused(section, resources, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**{section: {"resources": resources}})


def test_a_trainer_of_four_ranks_takes_a_gpu_bundle_each_packed_over_as_few_nodes_as_hold_them():
    p = plan(
        cfg(
            {"num_gpus": 1, "num_cpus": 2, "world_size": 4},
            {"standalone_replicas": 2, "num_gpus": 1, "num_cpus": 1},
        )
    )
    assert p.ranks == [Slot(r, 1.0, 2.0) for r in range(4)] and p.trainer == Slot(0, 1.0, 2.0)
    assert p.bundles[:4] == [{"GPU": 1.0, "CPU": 2.0}] * 4 and p.trainer_bundles == 4
    assert [s.bundle for s in p.standalone] == [4, 5] and p.gpus == 6
    assert p.groups()[0] == (p.bundles[:4], "PACK")  # may span nodes; one rank keeps STRICT_PACK
    assert plan(cfg({"num_gpus": 1}, {"num_gpus": 1})).groups()[0][1] == "STRICT_PACK"


def test_a_sharded_trainer_refuses_the_transports_its_host_gathered_weights_cannot_use():
    for transport in ("cuda_ipc", "vllm_ipc", "nccl"):
        with pytest.raises(ConfigError, match=rf"trainer.weight_transport = '{transport}' with trainer.world_size = 2"):
            cfg({"world_size": 2, "weight_transport": transport})
    assert cfg({"world_size": 2, "weight_transport": "gloo"}).trainer.world_size == 2
