"""The kernel: domain values and pure logic every program shares, no I/O (its modules: docs/modules.md)."""
