"""Helpers shared by the test suites (import as `helpers.<module>`; tests/conftest.py puts tests/ on the path)."""
