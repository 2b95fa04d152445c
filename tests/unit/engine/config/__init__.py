"""Tests: tests/unit/engine/config."""
