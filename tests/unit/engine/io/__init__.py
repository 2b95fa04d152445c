"""Tests: tests/unit/engine/io."""
