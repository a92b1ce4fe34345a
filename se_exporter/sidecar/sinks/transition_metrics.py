"""Turns transitions into the cumulative metrics: transition counters, notice and impact histograms.

These series live for the life of the process, so their ``event_type`` label takes only the documented types, and
``Other`` for anything else IMDS might send: a broken or hostile answer listing thousands of invented types would
otherwise add series (and memory) that never go away.
"""

from __future__ import annotations

from se_exporter.core.lifecycle import COMPLETED, STARTED
from se_exporter.core.model import EVENT_TYPES, affects_label, affects_vm
from se_exporter.core.spot import lead_seconds
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.sinks import DocumentChange, Sink

OTHER = "Other"
_KNOWN = frozenset(EVENT_TYPES)


class MetricsSink(Sink):
    name = "metrics"

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def on_change(self, change: DocumentChange) -> None:
        for transition in change.transitions:
            event_type = transition.event.event_type if transition.event.event_type in _KNOWN else OTHER
            affects = affects_label(affects_vm(transition.event, change.vm_name))
            self._metrics.transitions.labels(event_type, transition.kind, affects).inc()
            record = transition.record
            if transition.kind == STARTED and record.notice_seconds is not None:
                self._metrics.notice.labels(event_type, affects).observe(max(0.0, record.notice_seconds))
            elif transition.kind == COMPLETED and record.impact_seconds is not None:
                self._metrics.impact.labels(event_type, affects).observe(max(0.0, record.impact_seconds))
        for key, recommendation in change.follows.items():
            preempt = change.records.get(key)
            if preempt is not None:
                self._metrics.rebalance_to_preempt.observe(max(0.0, lead_seconds(preempt, recommendation) or 0.0))
