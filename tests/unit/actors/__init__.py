"""Tests: tests/unit/actors."""
