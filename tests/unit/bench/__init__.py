"""Tests: tests/unit/bench."""
