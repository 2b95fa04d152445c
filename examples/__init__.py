"""Examples a test executes (tests/e2e/test_examples.py, tests/contracts)."""
