"""Tests of the repository as a whole: docs, deploy files, locks, wheelhouses, images, the suite's own guards."""
