"""Tests: tests/unit/engine/data."""
