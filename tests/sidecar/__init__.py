"""Tests of se_exporter/sidecar (unit tests; integration tests live in tests/integration)."""
