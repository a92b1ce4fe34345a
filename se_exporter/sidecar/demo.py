"""What ``run --simulate`` (``make demo``) tells a person: a banner before anything else, a summary on exit.

Both are plain functions of values (the summary reads the registry's samples), printed by ``cli.run``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry

from se_exporter.infra.held import HeldFamilies
from se_exporter.sidecar.settings import Settings

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
TRANSITION_ORDER = ("scheduled", "rescheduled", "started", "completed", "canceled")


def banner(settings: Settings, imds_url: str, metrics_url: str, scenario: str, description: str,
           pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    speed = "real time" if settings.speed == 1 else f"{settings.speed:g}x real time"
    lines = [
        f"se-exporter demo: the sidecar polls a simulated IMDS playing the '{scenario}' scenario ({speed}).",
        f"  {description}",
        "",
        f"  Simulated IMDS  {imds_url}/metadata/scheduledevents?api-version={settings.first_api_version}",
        f"                  curl -H Metadata:true '{imds_url}/metadata/scheduledevents?api-version=2020-07-01'",
        f"  Metrics         {metrics_url}   (curl -s {metrics_url} | grep azure_scheduled)",
    ]
    if settings.forward_file:
        lines.append(f"  Documents       {settings.forward_file}   (every distinct document, one JSON line each)")
    if settings.otel_traces_exporter == "console":
        lines.append("  Spans           below, one line each as they end (set OTEL_EXPORTER_OTLP_ENDPOINT to send them "
                     "to a collector)")
    elif settings.otel_traces_exporter == "otlp":
        lines.append(f"  Spans           OTLP to {settings.otel_traces_endpoint or settings.otel_endpoint}")
    lines.append(f"  State           {settings.state_path}")
    lines.append(f"  Pauses          freeze the sidecar as a Freeze freezes the VM, while an event is listed: "
                 f"kill -STOP {pid}; sleep 2; kill -CONT {pid}")
    lines += ["", "  Log lines follow: one per lifecycle transition. Stop with Ctrl-C for a summary.", ""]
    return "\n".join(lines)


def samples(registry: CollectorRegistry, held: HeldFamilies | None = None) -> Samples:
    """Every sample of ``registry``, the held families' as counted (a first count is held at 0 only for scrapers)."""
    found: Samples = {}
    for family in [*registry.collect(), *(held.counted() if held is not None else ())]:
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _total(found: Samples, name: str, **labels: str) -> float:
    return sum(value for (sample, sample_labels), value in found.items()
               if sample == name and all((key, wanted) in sample_labels for key, wanted in labels.items()))


def _by(found: Samples, name: str) -> Iterable[tuple[dict[str, str], float]]:
    """The labels and value of each sample of ``name`` that is not 0."""
    for (sample, labels), value in sorted(found.items()):
        if sample == name and value:
            yield dict(labels), value


def summary(found: Samples, elapsed: float, scenario_time: float, settings: Settings) -> str:
    """One screen: how long it ran, what IMDS served, what happened to the events, where the outputs are."""
    polls = {labels["outcome"]: value for labels, value in _by(found, "azure_scheduled_events_polls_total")}
    failed = sum(value for outcome, value in polls.items() if outcome != "ok")
    lines = ["", f"se-exporter demo summary: ran {elapsed:.0f} s ({scenario_time:.0f} s of scenario time)",
             f"  IMDS polls      {polls.get('ok', 0):.0f} ok, {failed:.0f} failed",
             f"  Documents       {_total(found, 'azure_scheduled_events_document_changes_total'):.0f} distinct, "
             f"last incarnation {_total(found, 'azure_scheduled_events_document_incarnation'):.0f}",
             *_events(found), *_outputs(found, settings), f"  State           {settings.state_path}"]
    return "\n".join(lines)


def _events(found: Samples) -> list[str]:
    """The summary's lines of the transitions seen, per event type, and of the events listed at exit."""
    transitions: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in _by(found, "azure_scheduled_events_transitions_total"):
        transitions[labels["event_type"]][labels["transition"]] = int(value)
    lines = [] if transitions else [
        "  Transitions     none yet (the demo's first events appear within seconds; let it run longer)"]
    for index, (event_type, kinds) in enumerate(sorted(transitions.items())):
        counts = ", ".join(f"{kinds[kind]} {kind}" for kind in TRANSITION_ORDER if kind in kinds)
        lines.append(f"  {'Transitions' if index == 0 else '':<15} {event_type:<10} {counts}")
    pending: dict[str, float] = defaultdict(float)
    for labels, value in _by(found, "azure_scheduled_events_pending"):
        pending[labels["event_status"]] += value
    if pending:
        lines.append("  Listed at exit  " + ", ".join(f"{value:.0f} {status}" for status, value in pending.items()))
    return lines


def _outputs(found: Samples, settings: Settings) -> list[str]:
    """The summary's lines of what each output that is on delivered."""
    lines = []
    if settings.forward_file:
        written = _total(found, "azure_scheduled_events_forwarded_documents_total", sink="file")
        lines.append(f"  Forwarded       {written:.0f} documents to {Path(settings.forward_file)}")
    if settings.eventhubs_enabled:
        sent = _total(found, "azure_scheduled_events_forwarded_documents_total", sink="eventhubs")
        waiting = _total(found, "azure_scheduled_events_spool_documents")
        lines.append(f"  Event Hubs      {sent:.0f} acknowledged, {waiting:.0f} still spooled")
    if settings.otel_traces_exporter != "none":
        lines.append(f"  Spans           {_total(found, 'azure_scheduled_events_spans_exported_total'):.0f} exported, "
                     f"{_total(found, 'azure_scheduled_events_span_export_errors_total'):.0f} failed")
    felt = {labels["event_type"]: value for labels, value in _by(found, "azure_scheduled_events_pause_seconds_count")}
    if felt:
        lines.append("  Pauses felt     " + ", ".join(f"{value:.0f} during {event_type}" if event_type != "none"
                                                     else f"{value:.0f} unannounced"
                                                     for event_type, value in sorted(felt.items())))
    return lines
