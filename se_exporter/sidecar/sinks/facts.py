"""What an event and one of its transitions say, computed once for every output that tells a person: the log line,
the spans and the OpenTelemetry log records. Each output only names the facts its own way (the log line as they
are, OpenTelemetry under ``azure.scheduled_event.``), so a time or a duration never reads differently in two of
them: times are ISO 8601 in UTC with ``Z``, seconds are at least 0 and kept to the millisecond."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from se_exporter.core.lifecycle import CANCELED, COMPLETED, STARTED, Transition
from se_exporter.core.model import EVENT_FIELDS, ScheduledEvent, affects_vm
from se_exporter.core.spot import lead_seconds
from se_exporter.sidecar.metrics import LABEL_MARK
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt

# A value from IMDS holds at most this many characters (cut ones end in LABEL_MARK), a list at most
# MAX_ITEMS of them: a 1 MiB Description kept whole in each update span, span event and log record took hundreds
# of MiB while the collector was down.
MAX_CHARS = 1024
MAX_ITEMS = 256


def bounded(value: Any) -> Any:
    """A value within MAX_CHARS (and a list within MAX_ITEMS items of it)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_CHARS else value[:MAX_CHARS - len(LABEL_MARK)] + LABEL_MARK
    if isinstance(value, list):
        return [bounded(item) for item in value[:MAX_ITEMS]]
    return value


def time_fact(value: datetime) -> str:
    """A time as every output writes it: ISO 8601, UTC, ``Z``."""
    return value.isoformat().replace("+00:00", "Z")


def seconds_fact(value: float | None) -> float:
    """A duration as every output writes it: never below 0 (an unknown one is 0), to the millisecond."""
    return round(max(0.0, value or 0.0), 3)


def _value(value: Any) -> Any:
    if isinstance(value, tuple):
        return bounded(list(value))
    if isinstance(value, datetime):
        return time_fact(value)
    return bounded(value)


def event_facts(event: ScheduledEvent, incarnation: int | None, vm_name: str | None) -> dict[str, Any]:
    """An event as last listed: one fact per field of ``EVENT_FIELDS`` that has a value (named by its attribute),
    the document's incarnation and whether the event affects this VM (absent when that is unknown)."""
    facts: dict[str, Any] = {}
    for row in EVENT_FIELDS:
        value = getattr(event, row.attribute)
        if value is not None:
            facts[row.attribute] = _value(value)
    if incarnation is not None:
        facts["document_incarnation"] = incarnation
    affects = affects_vm(event, vm_name)
    if affects is not None:
        facts["affects_this_vm"] = affects
    return facts


def transition_facts(transition: Transition, change: DocumentChange) -> dict[str, Any]:
    """What a transition adds to its event's facts: its kind, the api-version that listed it, the NotBefore it moved
    from, the notice it came with (and whether no Scheduled came first), the recommendation a Preempt follows and
    how long before it that came, and, once the event is gone, how long its impact lasted."""
    record = transition.record
    facts: dict[str, Any] = {"transition": transition.kind.value, "api_version": change.api_version}
    if transition.previous_not_before is not None:
        facts["previous_not_before"] = time_fact(transition.previous_not_before)
    if transition.kind == STARTED:
        facts["notice_seconds"] = seconds_fact(record.notice_seconds)
        facts["skipped_scheduled"] = record.skipped_scheduled
    recommendation = change.follows.get(record.event.key)
    if recommendation is not None:
        facts["follows_recommendation_id"] = bounded(recommendation.event.event_id)
        facts["recommendation_lead_seconds"] = seconds_fact(lead_seconds(record, recommendation))
    if transition.kind == COMPLETED and record.impact_seconds is not None:
        facts["impact_seconds"] = seconds_fact(record.impact_seconds)
    if transition.kind in (COMPLETED, CANCELED):
        facts["longest_pause_seconds"] = seconds_fact(record.longest_pause)
    return facts


def pause_facts(felt: PauseFelt) -> dict[str, Any]:
    """What a pause adds to its event's facts (or says alone, unannounced): how long, when it began, whether CPU
    throttling of the sidecar's cgroup explains it, and the steal time the kernel reports over it."""
    facts: dict[str, Any] = {"pause_seconds": seconds_fact(felt.pause.seconds),
                             "pause_began": time_fact(datetime.fromtimestamp(felt.began_at, timezone.utc)),
                             "throttled": felt.pause.throttled}
    if felt.pause.steal_seconds is not None:
        facts["steal_seconds"] = seconds_fact(felt.pause.steal_seconds)
    return facts
