"""Tests of se_exporter/simulator (unit tests; integration tests live in tests/integration)."""
