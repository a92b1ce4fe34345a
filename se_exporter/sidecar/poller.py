"""The poll loop (IMDS -> lifecycle -> sinks) and the identity watcher, each run in a daemon thread.

The main thread only waits for a stop signal, so a poll stuck in a two-minute first call never delays shutdown.
Both write the snapshot through its owner (``CurrentState``); scrapes read it there.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping

from se_exporter.core import apiversion, lifecycle, pause, spot, watch
from se_exporter.core.errors import ImdsError, ImdsHttpError, ImdsThrottled, ImdsTimeout, InvalidDocument
from se_exporter.core.model import EventMemo, VmIdentity, event_key, parse_document, vm_name
from se_exporter.core.retry import Health, backoff
from se_exporter.infra.logs import fields
from se_exporter.sidecar.imds import ImdsClient
from se_exporter.sidecar.lifecycle_store import LifecycleStore, Restored
from se_exporter.sidecar.metrics import Metrics
from se_exporter.sidecar.pauses import PauseDetector
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange, FanOut, PauseFelt
from se_exporter.sidecar.snapshot import CurrentState, Snapshot

log = logging.getLogger("se_exporter")


class Poller:
    """Polls IMDS, keeps the snapshot, hands document changes to the sinks.

    Work per poll is one GET (two when IMDS refuses the api-version asked for: ``_fetch``) and one bytes
    comparison: parsing, the lifecycle diff and the sinks run only when the bytes (or the api-version) changed.
    """

    def __init__(self, imds: ImdsClient, metrics: Metrics, sinks: FanOut, settings: Settings,
                 state: CurrentState | None = None, clock: Callable[[], float] = time.time,
                 store: LifecycleStore | None = None, monotonic: Callable[[], float] = time.monotonic,
                 pauses: PauseDetector | None = None) -> None:
        self._imds = imds
        self._pauses = pauses  # read at the start of each poll and on its timeout (time.monotonic, as ``run``)
        # Durations (the lifecycle's, when the newer api-version is due again) are measured on ``monotonic``, and
        # timestamps read from ``clock`` (the wall clock): tests move either.
        self._monotonic = monotonic
        self._metrics = metrics
        self._sinks = sinks
        self._settings = settings
        self._clock = clock
        self._polls_ok = metrics.polls.labels("ok")  # looked up once: this is counted on every poll
        self._last_body: bytes | None = None
        self._memo = EventMemo()  # hands an unchanged event out again: the lifecycle diff keeps its record
        self._failures = 0
        self._health = Health()  # failing: the outcome of the current run of failed polls
        # Shared with the identity watcher and the scrapes (see snapshot.py); its own when none is given.
        self._state = state or CurrentState(Snapshot(vm_name=settings.vm_name,
                                                     api_version=settings.first_api_version))
        self._versions = apiversion.VersionChoice.from_setting(settings.api_version)
        self._store = store
        # Lifecycles open before a restart: the first diff starts from them, not from nothing (keyed as diff keys).
        restored = store.restore() if store is not None else Restored()
        self._restored = {event_key(record.event.event_id): record for record in restored.records.values()}
        self._listed()  # armed by the restored lifecycles: a first poll can take minutes
        # The watch the next successful read continues, or not (core/watch.py), and the read it continues from:
        # the saved ones until this process reads. The snapshot shows a watch only once a read decided it.
        self._watch_since, self._last_read = restored.watching_since, restored.last_read
        self._saved = -math.inf  # when the state file was last written, on the monotonic clock
        self._ended: Mapping[str, lifecycle.EventRecord] = {}  # recently ended events, so none begins twice
        requests = 2 if self._versions.negotiates else 1
        self.heartbeat_deadline = (time.monotonic() + requests * settings.effective_first_call_timeout
                                   + settings.effective_max_backoff + 10)

    @property
    def snapshot(self) -> Snapshot:
        return self._state.get()

    def set_identity(self, identity: VmIdentity) -> None:
        self._state.update(identity=identity, vm_name=vm_name(self._settings.vm_name, identity))

    def poll_once(self) -> float:
        """One poll; returns how long to wait before the next one."""
        started = time.monotonic()
        self._felt(started)
        try:
            body, version = self._fetch(self._monotonic())
            now = self._clock()
            read = watch.Read(now, self._monotonic())
            watching = watch.watching_since(self._watch_since, self._last_read, read, self._settings.watch_gap)
            if body != self._last_body or version != self.snapshot.api_version:
                self._apply(body, version, read, watching)  # raises InvalidDocument before anything is changed
            elif watching != self._watch_since or self._refresh_due(read):
                self._save(self.snapshot.records, watching, read)  # a restart continues this watch, not the old
        except ImdsError as error:
            self._metrics.poll_duration.observe(time.monotonic() - started)
            if self._paused_through(error, started):
                return 0.0  # not IMDS' failure: asked again at once
            return self._failed(error)
        finally:
            self._listed()
        self._metrics.poll_duration.observe(time.monotonic() - started)
        self._polls_ok.inc()
        if self._health.recover():
            log.info("IMDS recovered after %d failed polls", self._failures,
                     extra=fields(imds_state="ok", failed_polls=self._failures))
        self._failures = 0
        self._watch_since, self._last_read = watching, read
        self._state.update(up=True, last_success=now, watching_since=watching)
        return self._settings.poll_interval

    def _felt(self, now: float) -> bool:
        """The pauses found up to ``now`` folded into the records (their one writer) and handed to the sinks;
        whether there were."""
        found = self._pauses.take(now) if self._pauses is not None else []
        if not found:
            return False
        snap = self.snapshot
        folded: Mapping[str, lifecycle.EventRecord]
        if not snap.has_document:  # before the first document, the restored lifecycles are the ones listed
            folded = self._restored = dict(pause.fold(self._restored, found))
        else:
            folded = pause.fold(snap.records, found)
            if self._watch_since is not None and self._last_read is not None:
                self._save(folded, self._watch_since, self._last_read)  # saved before shown: a restart keeps them
            snap = self._state.update(records=folded)
        wall = self._clock() - now  # a monotonic reading plus this is the wall clock's
        for each in found:
            record = folded.get(each.event_key) if each.event_key is not None else None
            self._sinks.on_pause(PauseFelt(each, record, wall + each.began, snap.vm_name, snap.identity))
        return True

    def _paused_through(self, error: ImdsError, started: float) -> bool:
        """Whether a timed-out poll was paused past its deadline: the VM, not IMDS, did not answer in time."""
        if self._pauses is None or not isinstance(error, ImdsTimeout):
            return False
        now = time.monotonic()
        self._pauses.overslept(started + self._imds.current_timeout, now)
        return self._felt(now)

    def _listed(self) -> None:
        if self._pauses is not None:  # before the first document, the restored lifecycles are the ones listed
            snap = self.snapshot
            self._pauses.listed(snap.records if snap.has_document else self._restored, snap.vm_name, time.monotonic())

    def _refresh_due(self, read: watch.Read) -> bool:
        """Whether a quiet VM's state file is due again, so that its ``last_read`` stays within half the allowed gap
        of the real last read (lifecycle_store.py says why half, and why not every poll)."""
        assert read.monotonic is not None  # this process's reads have both clocks
        return read.monotonic - self._saved >= self._settings.watch_gap / 2

    def _save(self, records: Mapping[str, lifecycle.EventRecord], watching: float, read: watch.Read) -> None:
        if self._store is not None:
            self._store.save(records, watching, read)
            self._saved = read.monotonic if read.monotonic is not None else -math.inf

    def _fetch(self, now: float) -> tuple[bytes, str]:
        """One Scheduled Events body and the api-version it answers (``core/apiversion.py``). With ``auto``, a
        version IMDS refuses is replaced by the fallback within the same poll, so switching leaves no gap; a retry
        of the newer version that meets an outage reads the fallback too (an outage is no version answer), and so
        does one answered with a 200 that is not a document: it would otherwise be asked again, and fail, every poll
        after (it is parsed here, once an hour, and again by ``_apply`` when it is one)."""
        choice = self._versions
        version = choice.to_ask(now)
        try:
            body = self._imds.scheduled_events(version)
            if version != choice.in_use:  # a retry: only a document answers it
                parse_document(body)
            return body, version
        except ImdsError as error:
            if not self._falls_back(error, version, choice, now):
                raise
        return self._imds.scheduled_events(apiversion.FALLBACK), apiversion.FALLBACK

    def _falls_back(self, error: ImdsError, version: str, choice: apiversion.VersionChoice, now: float) -> bool:
        """Whether the poll that asked ``version`` and met ``error`` reads the fallback now (see ``_fetch``); the
        choice of version moved on, and said once, where it does."""
        if not choice.negotiates or version == apiversion.FALLBACK:
            return False
        if isinstance(error, ImdsHttpError) and apiversion.refuses_version(error.status, error.body):
            self._versions = choice.refused(version, now)
            if version == choice.in_use:  # not a retry: say it once, when it happens
                log.warning("IMDS does not serve Scheduled Events api-version %s (%s); polling %s, and asking "
                            "for %s again every %g s", version, error, apiversion.FALLBACK, version,
                            apiversion.RETRY_NEWEST_SECONDS,
                            extra=fields(api_version=apiversion.FALLBACK, refused_api_version=version))
            return True
        if version == choice.in_use or isinstance(error, ImdsThrottled):
            return False
        self._versions = choice.retry_failed(now)
        if isinstance(error, InvalidDocument):  # not an outage: IMDS answered, with something else
            log.warning("IMDS answered the retry of Scheduled Events api-version %s with no document (%s); "
                        "polling %s, and asking again in %g s", version, error, apiversion.FALLBACK,
                        apiversion.RETRY_NEWEST_SECONDS,
                        extra=fields(api_version=apiversion.FALLBACK, retried_api_version=version))
        return True

    def _apply(self, body: bytes, version: str, read: watch.Read, watching: float) -> None:
        document = parse_document(body, self._memo)
        now, elapsed = read.wall, self._monotonic()
        previous = self.snapshot.records if self.snapshot.has_document else self._restored
        step = lifecycle.diff(previous, document, now, self._ended, apiversion.unlisted_types(version), elapsed)
        self._save(step.records, watching, read)
        first = self._last_body is None
        self._last_body = body
        self._ended = step.ended
        before = self.snapshot.incarnation
        if document.incarnation is not None and before is not None and document.incarnation < before:
            # Azure: the incarnation "increases when the events array changes". Lower means IMDS started counting
            # again or a stale answer; the document is still what IMDS says now, so it is used, and said.
            self._metrics.incarnation_regressions.inc()
            log.warning("DocumentIncarnation went backwards from %d to %d; using the document as IMDS' current "
                        "state (events that had ended stay ended)", before, document.incarnation,
                        extra=fields(document_incarnation=document.incarnation, previous_incarnation=before))
        was = self.snapshot.api_version
        self._versions = self._versions.answered(version)
        if version != was:
            log.info("Scheduled Events api-version in use: %s (was %s)", version, was,
                     extra=fields(api_version=version, previous_api_version=was))
        # The watch with the records, in one snapshot: a scrape never sees an event without the watch it came in.
        snap = self._state.update(records=step.records, incarnation=document.incarnation, has_document=True,
                                  api_version=version, watching_since=watching)
        self._listed()  # armed before the sinks run: a pause while they work belongs to these events
        self._metrics.document_changes.inc()
        if document.warnings:
            self._metrics.document_warnings.inc(len(document.warnings))
            which = "without a DocumentIncarnation" if document.incarnation is None else str(document.incarnation)
            log.warning("document %s parsed with %d warnings: %s", which, len(document.warnings),
                        "; ".join(document.warnings[:5]), extra=fields(warnings=list(document.warnings[:50])))
        if first:
            log.info("first document read", extra=fields(document_incarnation=document.incarnation,
                                                          events=len(document.events)))
        self._sinks.on_change(DocumentChange(
            raw=body, document=document, transitions=step.transitions, records=step.records, observed_at=now,
            vm_name=snap.vm_name, identity=snap.identity, api_version=version,
            follows=spot.links(step.transitions, step.records, step.ended)))

    def _failed(self, error: ImdsError) -> float:
        self._metrics.polls.labels(error.outcome).inc()
        self._failures += 1
        if self._health.fail(error.outcome):  # one line per change of IMDS health, not per failed poll
            state = "keeping the last valid state" if self.snapshot.has_document else "no document read yet"
            log.warning("IMDS poll failed: %s (%s)", error, state,
                        extra=fields(imds_state=error.outcome, url=self._imds.events_url))
        self._state.update(up=False)
        interval, cap = self._settings.poll_interval, self._settings.effective_max_backoff
        if isinstance(error, ImdsThrottled) and error.retry_after is not None:
            return min(max(interval, error.retry_after), cap)
        return backoff(self._failures, interval, cap)

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set. The next poll is due ``delay`` after this one *started*, so the
        poll's own duration is inside the interval and the rate stays fixed."""
        while not stop.is_set():
            started = time.monotonic()
            requests = 2 if self._versions.negotiates else 1  # a refused version is followed by the fallback
            self.heartbeat_deadline = (started + requests * self._imds.current_timeout
                                       + self._settings.effective_max_backoff + 10)
            try:
                delay = self.poll_once()
            except Exception:  # a bug must not end the loop silently: log it, wait, go on
                log.exception("unexpected error in the poll loop")
                delay = self._settings.effective_max_backoff
            waiting = time.monotonic()
            due = max(started + delay, waiting)  # a poll longer than its interval is no pause
            if not stop.wait(due - waiting) and self._pauses is not None:
                self._pauses.overslept(due, time.monotonic())

    @property
    def healthy(self) -> bool:
        """The loop came round in time (``/healthz``)."""
        return time.monotonic() <= self.heartbeat_deadline

    @property
    def ready(self) -> bool:
        """A valid document has been read (``/readyz``)."""
        return self.snapshot.has_document


class IdentityWatcher:
    """Reads compute metadata once it can; retries in the background with a capped backoff."""

    def __init__(self, imds: ImdsClient, poller: Poller, metrics: Metrics, first_wait: float = 1.0,
                 max_wait: float = 60.0) -> None:
        self._imds, self._poller, self._metrics = imds, poller, metrics
        self._first_wait, self._max_wait = first_wait, max_wait
        # Set after the first try, failed or not: the poll loop waits for it (briefly), so that the first
        # forwarded document already carries the VM's id and partition key in the common case.
        self.first_attempt = threading.Event()

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                identity = self._imds.compute()
            except ImdsError as error:
                self.first_attempt.set()
                self._metrics.identity_errors.inc()
                failures += 1
                if failures == 1:
                    log.warning("cannot read VM identity, retrying in the background: %s", error)
                stop.wait(backoff(failures, self._first_wait, self._max_wait))
                continue
            self._poller.set_identity(identity)
            self.first_attempt.set()
            log.info("VM identity read", extra=fields(vm_name=self._poller.snapshot.vm_name, vm_id=identity.vm_id,
                                                      vmss_name=identity.vmss_name or None,
                                                      location=identity.location))
            return
