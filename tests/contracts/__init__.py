"""Tests: tests/contracts."""
