"""Tests: tests/unit/engine/weights."""
