"""One log line per lifecycle transition, with the fields a person needs to act on it."""

from __future__ import annotations

import logging

from se_exporter.core.lifecycle import CANCELED, COMPLETED, RESCHEDULED, SCHEDULED, STARTED, Transition
from se_exporter.core.model import affects_label, affects_vm
from se_exporter.core.spot import lead_seconds
from se_exporter.infra.logs import fields
from se_exporter.sidecar.sinks import DocumentChange, Sink

log = logging.getLogger("se_exporter.events")

_LEVELS = {SCHEDULED: logging.WARNING, STARTED: logging.WARNING, RESCHEDULED: logging.INFO,
           COMPLETED: logging.INFO, CANCELED: logging.INFO}


class LogSink(Sink):
    """A neighbour's event (one that does not list this VM) is logged at info whatever its transition: an
    availability set lists every VM's maintenance on each of its VMs, and only this VM's own should warn."""

    name = "log"

    def export(self, change: DocumentChange) -> None:
        for transition in change.transitions:
            details = _details(transition, change)
            level = logging.INFO if details["affects_this_vm"] == "false" else _LEVELS.get(transition.kind,
                                                                                         logging.INFO)
            event = transition.event
            log.log(level, "%s %s %s", event.event_type, event.event_id, transition.kind, extra=fields(**details))


def _details(transition: Transition, change: DocumentChange) -> dict[str, object]:
    event, record = transition.event, transition.record
    details: dict[str, object] = {
        "transition": transition.kind,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "event_status": event.event_status,
        "event_source": event.event_source,
        "resources": list(event.resources),
        "affects_this_vm": affects_label(affects_vm(event, change.vm_name)),
        "document_incarnation": change.document.incarnation,
    }
    if event.not_before is not None:
        details["not_before"] = event.not_before.isoformat()
    if transition.previous_not_before is not None:
        details["previous_not_before"] = transition.previous_not_before.isoformat()
    if event.duration_seconds is not None:
        details["duration_seconds"] = event.duration_seconds
    if transition.kind == STARTED and record.notice_seconds is not None:
        details["notice_seconds"] = round(record.notice_seconds, 3)
        if record.skipped_scheduled:  # no Scheduled was ever listed: nothing was missed
            details["skipped_scheduled"] = True
    recommendation = change.follows.get(event.key)
    if recommendation is not None:
        details["follows_recommendation_id"] = recommendation.event.event_id
        details["recommendation_lead_seconds"] = round(max(0.0, lead_seconds(record, recommendation) or 0.0), 3)
    if transition.kind == COMPLETED and record.impact_seconds is not None:
        details["impact_seconds"] = round(record.impact_seconds, 3)
    return details
