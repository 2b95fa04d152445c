"""Tests: tests/unit/engine/tasks."""
