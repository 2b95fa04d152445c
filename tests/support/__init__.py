"""Tests: tests/support."""
