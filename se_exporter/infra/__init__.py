"""What every program uses, above the core: options, logging, platform I/O, files and locks, the one HTTP server,
the process-wide state a command changes, and the one Azure helper package (``azure/``)."""
