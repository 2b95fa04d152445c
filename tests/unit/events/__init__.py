"""Tests: tests/unit/events."""
