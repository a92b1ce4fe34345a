"""Tests of se_exporter/infra: options, logs, platform I/O, the HTTP server, the Azure helpers."""
