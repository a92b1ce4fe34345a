"""One log line per lifecycle transition, with the fields a person needs to act on it."""

from __future__ import annotations

import logging

from se_exporter.core.lifecycle import CANCELED, COMPLETED, RESCHEDULED, SCHEDULED, STARTED
from se_exporter.core.model import affects_label, affects_vm
from se_exporter.infra.logs import fields
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt, Sink
from se_exporter.sidecar.sinks.facts import event_facts, pause_facts, transition_facts

log = logging.getLogger("se_exporter.events")

_LEVELS = {SCHEDULED: logging.WARNING, STARTED: logging.WARNING, RESCHEDULED: logging.INFO,
           COMPLETED: logging.INFO, CANCELED: logging.INFO}
# A line is for a person reading a log: the Description (up to a KiB) stays with the spans and log records.
_SPANS_ONLY = frozenset({"description"})


class LogSink(Sink):
    """A neighbour's event (one that does not list this VM) is logged at info whatever its transition: an
    availability set lists every VM's maintenance on each of its VMs, and only this VM's own should warn."""

    name = "log"

    def on_change(self, change: DocumentChange) -> None:
        for transition in change.transitions:
            event = transition.event
            affects = affects_vm(event, change.vm_name)
            facts = {name: value for name, value in event_facts(event, change.document.incarnation,
                                                                 change.vm_name).items() if name not in _SPANS_ONLY}
            told = transition_facts(transition, change)
            details = {"transition": told.pop("transition"), **facts, "affects_this_vm": affects_label(affects),
                       **told}
            level = logging.INFO if affects is False else _LEVELS.get(transition.kind, logging.INFO)
            log.log(level, "%s %s %s", event.event_type, event.event_id, transition.kind, extra=fields(**details))

    def on_pause(self, felt: PauseFelt) -> None:
        """A warning: a pause is what a person asks about after an incident, announced or not."""
        event = felt.record.event if felt.record is not None else None
        what = "CPU throttling of this sidecar's cgroup" if felt.pause.throttled else (
            f"while {event.event_type} {event.event_id} was {event.event_status}" if event is not None
            else "with no event of this VM listed (unannounced)")
        log.warning("the VM (or this process) was paused for %.2f s, %s", felt.pause.seconds, what,
                    extra=fields(**pause_facts(felt), event_type=felt.pause.event_type,
                                 event_id=None if event is None else event.event_id))
