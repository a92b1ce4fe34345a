"""The IMDS simulator: scenarios (pure timelines), faults, and an HTTP server that serves them."""
