"""Tests of se_exporter/fleet (unit tests; integration tests live in tests/integration)."""
