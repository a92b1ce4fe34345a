"""What a person reads: spans as one line each (console, text), and the demo's exit summary."""

from __future__ import annotations

from se_exporter.sidecar.demo import banner, summary
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks.tracing import span_line
from tests.sidecar.test_spans import run

FREEZE = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"


def test_a_span_is_one_short_line() -> None:
    """Each span of the documented live migration prints as one line: end time, name, type, EventId, what
    happened, how long (for the long spans) and the trace id; no JSON, under 160 characters."""
    lines = [span_line(span) for span in run("live-migration")]
    assert all(line.endswith("\n") and line.count("\n") == 1 and len(line) < 160 for line in lines), lines
    assert not any("{" in line for line in lines)
    root = next(line for line in lines if " span scheduled_event " in line)
    assert f"Freeze {FREEZE} completed 930.0s trace c9f285250b239071c82752f323e95d19" in root
    started = next(line for line in lines if "scheduled_event.update" in line and " started " in line)
    assert started.split()[-3:] == ["started", "trace", "c9f285250b239071c82752f323e95d19"]  # no duration: instant
    notice = next(line for line in lines if "scheduled_event.notice" in line)
    assert " 900.0s " in notice


def test_summary_counts_what_happened() -> None:
    """The exit summary states polls, documents, transitions per type in lifecycle order, what is still listed and
    what was forwarded, from the metrics' own samples."""
    def sample(name: str, value: float, **labels: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], float]:
        return (name, tuple(sorted(labels.items()))), value

    found = dict([
        sample("azure_scheduled_events_polls_total", 40, outcome="ok"),
        sample("azure_scheduled_events_polls_total", 2, outcome="throttled"),
        sample("azure_scheduled_events_document_changes_total", 5),
        sample("azure_scheduled_events_document_incarnation", 6),
        sample("azure_scheduled_events_transitions_total", 1, event_type="Freeze", transition="completed"),
        sample("azure_scheduled_events_transitions_total", 1, event_type="Freeze", transition="scheduled"),
        sample("azure_scheduled_events_transitions_total", 0, event_type="Freeze", transition="canceled"),
        sample("azure_scheduled_events_transitions_total", 1, event_type="Reboot", transition="scheduled"),
        sample("azure_scheduled_events_pending", 1, event_type="Reboot", event_status="Scheduled"),
        sample("azure_scheduled_events_pending", 1, event_type="Redeploy", event_status="Scheduled"),
        sample("azure_scheduled_events_forwarded_documents_total", 5, sink="file"),
        sample("azure_scheduled_events_pause_seconds_count", 1, event_type="Freeze"),
        sample("azure_scheduled_events_pause_seconds_count", 2, event_type="none"),
    ])
    text = summary(found, 61.4, 3070, Settings(forward_file="out/documents.jsonl", state_dir="out/state"))
    lines = text.splitlines()
    assert "se-exporter demo summary: ran 61 s (3070 s of scenario time)" in lines
    assert "  IMDS polls      40 ok, 2 failed" in lines
    assert "  Documents       5 distinct, last incarnation 6" in lines
    assert "  Transitions     Freeze     1 scheduled, 1 completed" in lines
    assert "                  Reboot     1 scheduled" in lines
    assert "  Listed at exit  2 Scheduled" in lines
    assert "  Forwarded       5 documents to out/documents.jsonl" in lines
    assert "  Pauses felt     1 during Freeze, 2 unannounced" in lines
    assert len(lines) <= 20


def test_the_banner_says_how_to_make_a_pause() -> None:
    """The demo's Freeze shows a pause when a person makes one: the banner names this process' pid."""
    text = banner(Settings(state_dir="out/state"), "http://127.0.0.1:1", "http://127.0.0.1:2/metrics", "demo", "",
                  pid=4242)
    assert "kill -STOP 4242; sleep 2; kill -CONT 4242" in text
