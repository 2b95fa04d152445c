"""Tests: tests/e2e."""
