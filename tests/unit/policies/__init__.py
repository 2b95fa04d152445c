"""Tests: tests/unit/policies."""
