"""se-exporter: a read-only sidecar that makes Azure Scheduled Events visible.

It polls the Instance Metadata Service (IMDS) Scheduled Events endpoint, tracks each
event's lifecycle and exposes what it sees as Prometheus metrics. It never approves
(POSTs) an event: responders approve, we observe.
"""

from __future__ import annotations

__version__ = "0.1.0"
