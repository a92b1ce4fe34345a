"""Tests of se_exporter/consume (unit tests; integration tests live in tests/integration)."""
