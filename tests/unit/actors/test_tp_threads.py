"""The OpenMP threads of a tensor-parallel engine's workers on CPU (``actors.vllm.engine.cpu_threads``):
unbound ('nobind', the default), each rank takes its share of the process's threads, one at least
— not one per core of the machine each (ranks x cores threads spinning on the same cores: the
backend check at TP=2 took ~180 s instead of ~35 s); a binding that names cores is vLLM's to size."""

from __future__ import annotations

import pytest

from shunter.actors.vllm.engine import cpu_threads


@pytest.mark.parametrize(
    ("bind", "tp", "given", "want"),
    [
        ("nobind", 2, None, "1"),
        ("nobind", 2, "1", "1"),
        ("nobind", 2, "8", "4"),
        ("nobind", 4, "2", "1"),
        ("nobind", 2, "junk", "1"),
        ("nobind", 1, None, None),  # one rank: as before
        ("0|1", 2, None, None),  # vLLM sets one thread per core named
        ("auto", 2, "4", None),
    ],
)
def test_each_unbound_rank_gets_its_share_of_the_threads(bind, tp, given, want):
    assert cpu_threads(bind, tp, given) == want
