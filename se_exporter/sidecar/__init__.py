"""``se-exporter run``: the sidecar. IMDS client and transport, the poll loop, the snapshot, metrics, the HTTP
endpoints, state on disk, the sinks (``sinks/``), and the assembly that starts and stops them (``assembly``)."""
