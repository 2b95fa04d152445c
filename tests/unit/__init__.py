"""Tests: tests/unit."""
