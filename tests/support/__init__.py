"""What the tests share: servers on loopback, fakes, guards and helpers (no tests here)."""
