"""Tests of se_exporter/core (unit tests; integration tests live in tests/integration)."""
