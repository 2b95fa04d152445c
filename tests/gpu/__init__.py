"""Tests: tests/gpu."""
