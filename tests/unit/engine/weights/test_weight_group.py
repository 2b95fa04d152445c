"""Weight groups (``engine.weights.group``) over gloo — the CPU stand-in of the nccl transport,
the same code path: the trainer's ``WeightSender`` broadcasts a published flat copy, a replica
receives it bucket by bucket; a missing or wrong peer yields an error within the deadline."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from shunter.engine.weights import transport as wt
from shunter.engine.weights.group import (
    WeightGroupError,
    WeightSender,
    make_group,
    recv_flat,
)

pytestmark = pytest.mark.timeout(60)


def _items(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        ("model.embed_tokens.weight", torch.randn(50, 8, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g)),
        ("model.norm.weight", torch.randn(8, generator=g)),
    ]


def _publish(pub: wt.FlatPublisher, version: int, seed: int = 0) -> bytes:
    return pub.publish(_items(seed), torch.float32, wire=wt.FLAT, version=version)


def _join_and_receive(host, port, package, out: dict, *, timeout_s=10.0, expect_version=None):
    try:
        group = make_group("gloo", host, port, 1, 2, timeout_s)
        layout = wt.package_layout(package)
        buf = torch.zeros(layout["nbytes"] // 4, dtype=torch.float32)
        out["stats"] = recv_flat(group, buf, expect_version or layout["version"], timeout_s=timeout_s)
        out["weights"] = dict(wt.flat_views(buf, layout["entries"]))
    except Exception as e:  # noqa: BLE001 - the test reads it
        out["error"] = e


def test_a_published_version_arrives_bytewise_in_buckets():
    pub = wt.FlatPublisher()
    sender = WeightSender("gloo", pub, bucket_bytes=512, timeout_s=10)
    package = _publish(pub, 1)
    host, port = sender.open("standalone-0")
    got: dict = {}
    t = threading.Thread(target=_join_and_receive, args=(host, port, package, got))
    t.start()
    stats = sender.send("standalone-0", 1)
    t.join(10)
    assert "error" not in got, got.get("error")
    nbytes = sum(x.numel() for _, x in _items()) * 4
    assert stats["nbytes"] == got["stats"]["nbytes"] == nbytes
    assert stats["buckets"] == got["stats"]["buckets"] == -(-nbytes // 512) > 1
    for name, x in _items():
        assert torch.equal(got["weights"][name], x), name
    sender.close()


def test_the_older_of_two_kept_versions_can_still_be_sent_and_a_third_is_refused():
    pub = wt.FlatPublisher()
    for v in (1, 2, 3):
        _publish(pub, v, seed=v)
    assert pub.buffer(2)[0].numel() > 0
    with pytest.raises(LookupError, match="version 1 are no longer kept"):
        pub.buffer(1)


def test_a_replica_that_never_joins_fails_the_send_within_the_deadline():
    pub = wt.FlatPublisher()
    sender = WeightSender("gloo", pub, timeout_s=1.5)
    _publish(pub, 1)
    sender.open("standalone-0")
    t0 = time.monotonic()
    with pytest.raises(WeightGroupError, match="standalone-0 never joined"):
        sender.send("standalone-0", 1)
    assert time.monotonic() - t0 < 8
    with pytest.raises(WeightGroupError, match="no weight group with standalone-0"):
        sender.send("standalone-0", 1)  # the failed group was dropped: the next load joins anew
    sender.close()


def test_a_receiver_whose_trainer_never_sends_fails_within_the_deadline():
    pub = wt.FlatPublisher()
    sender = WeightSender("gloo", pub, timeout_s=10)
    package = _publish(pub, 1)
    host, port = sender.open("standalone-0")
    got: dict = {}
    t0 = time.monotonic()
    t = threading.Thread(target=_join_and_receive, args=(host, port, package, got), kwargs={"timeout_s": 1.5})
    t.start()
    t.join(15)
    assert isinstance(got.get("error"), WeightGroupError), got
    assert time.monotonic() - t0 < 12
    sender.close()


def test_a_receiver_expecting_another_version_refuses_the_bytes():
    pub = wt.FlatPublisher()
    sender = WeightSender("gloo", pub, timeout_s=5)
    package = _publish(pub, 1)
    _publish(pub, 2, seed=2)
    host, port = sender.open("standalone-0")
    got: dict = {}
    t = threading.Thread(target=_join_and_receive, args=(host, port, package, got), kwargs={"timeout_s": 5})
    t.start()
    with pytest.raises(WeightGroupError):  # the receiver closed the group after the header
        sender.send("standalone-0", 2)
    t.join(10)
    assert "expected version 1" in str(got.get("error")), got
    sender.close()


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown weight group backend 'mpi'"):
        WeightSender("mpi", wt.FlatPublisher())
