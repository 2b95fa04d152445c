"""Shared fixtures. The heavy ones (a Ray cluster, a tiny model, vLLM) are session-scoped
and built once; the unit tier needs none of them."""

from __future__ import annotations

import itertools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from shunter.actors.launch.cluster import local_only

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    local_only()  # as a default run: every socket on 127.0.0.1
    # three simulated GPUs: resources only (nothing here runs CUDA), for the placement tests
    ray.init(
        num_cpus=4,
        num_gpus=3,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        namespace="shunter",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


# -- the order tests run in, on pytest-xdist's workers ------------------------------------------
# Seconds a test took (fresh clone, two workers, the 2-core machine); only their order
# matters: the longest start first, one on each worker, and the short ones come last, where a
# worker that runs out steals them (worksteal hands each worker a contiguous half of the
# collection and steals from the end). Unlisted: an e2e test counts as EXPECTED_E2E_S, any other
# as nothing.
EXPECTED_S = {  # test function -> seconds (tests/e2e, fresh clone of 90594b2, 2026-12-06)
    "test_a_run_under_kills_and_a_stop_trains_every_prompt_once": 153,
    # three TP=2 engine starts (~20-95 s each on a loaded machine); measured 113-151 s alone, 2026-12-07
    "test_tensor_parallel_replicas_serve_take_weights_and_a_killed_worker_gets_its_replica_replaced": 150,
    "test_a_run_across_two_raylets_survives_losing_its_replica_node": 136,
    "test_weights_travel_over_gloo_groups_and_a_late_replica_gets_them_before_requests": 120,
    "test_separate_run_learns_with_partial_rollout": 119,
    "test_a_run_listens_only_on_loopback_stops_on_ctrl_c_and_resumes_exactly_once": 100,
    "test_a_killed_replica_loses_no_sample_and_releases_its_rank": 94,
    "test_trainer_then_coordinator_killed_the_run_resumes_and_trains_each_group_once": 67,
    "test_lend_when_idle_lends_hybrid_replicas_and_ranks_never_collide": 63,
    "test_multi_turn_trajectories_train_and_resume_across_weight_loads": 59,
    "test_trajectories_longer_than_generate_timeout_s_live_while_they_make_progress": 50,
    "test_a_second_ctrl_c_stops_at_once_quietly_and_leaves_no_process": 48,
}
EXPECTED_E2E_S = 30


def _expected_s(item: pytest.Item) -> float:
    name = getattr(item, "originalname", item.name)
    return EXPECTED_S.get(name, EXPECTED_E2E_S if item.get_closest_marker("e2e") else 0.0)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2``, scripts/test.sh): the slow tests are dealt round the
    workers' initial shares, longest first, and each share ends with quick ones. Run alone (no
    ``-n``), the order stays as collected."""
    worker = getattr(config, "workerinput", None)  # set in an xdist worker, which collects
    workers = int(worker["workercount"]) if worker else 0
    if workers < 2:
        return
    slow = sorted((i for i in items if _expected_s(i) > 0), key=_expected_s, reverse=True)
    quick = iter([i for i in items if _expected_s(i) == 0])
    left, out = len(items), []
    for k in range(workers):  # the share worksteal sends worker k first: what is left // workers left
        share = left // (workers - k)
        left -= share
        mine = slow[k::workers]
        out += mine + list(itertools.islice(quick, max(0, share - len(mine))))
    out += list(quick)
    assert len(out) == len(items)
    items[:] = out
