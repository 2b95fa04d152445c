"""Tests: tests/unit/engine/trainer."""
