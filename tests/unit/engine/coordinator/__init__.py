"""Tests: tests/unit/engine/coordinator."""
