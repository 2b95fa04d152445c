"""Tests: tests/unit/engine/replica."""
