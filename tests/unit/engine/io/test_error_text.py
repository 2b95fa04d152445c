"""Numbers of seconds in messages read as a person would write them (``engine/io/errors.secs``):
was ``run.policy_timeout_s = 6.66667s`` for a timeout computed as 20 / 3."""

from __future__ import annotations

import pytest

from shunter.engine.io.errors import secs


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (20 / 3, "6.67"),
        (2 / 3, "0.667"),
        (0.3, "0.3"),
        (2.0, "2"),
        (10.0, "10"),
        (99.96, "100"),
        (120.0, "120"),
        (7200.4, "7200"),
        (1e-5, "0.00001"),
        (0.0, "0"),
    ],
)
def test_seconds_are_rounded_to_three_digits_without_an_exponent(value, text):
    assert secs(value) == text
