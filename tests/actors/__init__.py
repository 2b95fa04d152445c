"""Tests: tests/actors."""
