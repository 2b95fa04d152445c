"""Tests: tests/unit/engine/models."""
