"""Tests: tests/unit/engine."""
