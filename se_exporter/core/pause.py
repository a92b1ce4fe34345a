"""Pauses the VM lived through, told from how late a thread woke, and the event each belongs to.

While the VM is frozen no thread of the guest runs, but its monotonic clock keeps counting: a thread due to run
again at ``due`` that next runs at ``now`` was stopped for about ``now - due``. Only the monotonic clock is read
(a wall clock stepped by NTP, or a VM restored from a snapshot, is no pause). No clock reads and no I/O here: the
sidecar's detector (``sidecar/pauses.py``) passes the readings, so a table of readings is a complete test.

What a pause cannot tell apart from inside the guest (docs/events.md): a frozen VM, a stopped process (SIGSTOP, a
debugger) and a CPU so starved that the thread did not run. Throttling of the sidecar's own cgroup is told apart
by its ``cpu.stat`` (the caller passes how much throttled time grew over the pause).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from se_exporter.core.lifecycle import EventRecord
from se_exporter.core.model import STATUS_STARTED, affects_vm

TICK = 0.04  # seconds between the armed detector's wake-ups: 25 a second, 40 ms resolution
ARMED_MIN = 0.25  # the shortest pause counted while armed: a loaded machine wakes a thread tens of ms late
IDLE_MIN = 1.0  # the shortest counted from the poll loop's own lateness (idle): a wait of a second, overslept
ARMED_FOR = 60.0  # seconds the detector stays armed after this VM's last event is gone
BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 30, 60)  # seconds: the sidecar's pause histogram and the fleet's
UNANNOUNCED = "none"  # the event_type of a pause no listed event explains
THROTTLED_SHARE = 0.5  # a pause at least this much of which was CPU throttling of the cgroup is throttling
# The most impactful type first: a pause felt while several of this VM's events are listed belongs to the first.
IMPACT_ORDER = ("Terminate", "Preempt", "Redeploy", "Reboot", "Freeze", "SpotRebalanceRecommendation")


@dataclass(frozen=True)
class Pause:
    """One pause: ``ended`` is the monotonic reading after it, ``seconds`` its length; the event it belongs to (its
    key and type), or none (``event_type`` ``none``); whether CPU throttling of the cgroup explains it."""

    ended: float
    seconds: float
    event_key: str | None = None
    event_type: str = UNANNOUNCED
    throttled: bool = False
    steal_seconds: float | None = None  # CPU time the hypervisor says it took, per CPU, over the pause and the look
    # before it (None where the kernel does not say)

    @property
    def began(self) -> float:
        return self.ended - self.seconds


def late_by(due: float, now: float, least: float) -> float | None:
    """How long a thread due to run at ``due`` and running at ``now`` was stopped, when at least ``least``."""
    late = now - due
    return late if late >= least else None


def owner(records: Iterable[EventRecord], vm_name: str | None) -> EventRecord | None:
    """The event a pause felt while ``records`` were listed belongs to: this VM's (or one that cannot tell whose it
    is: a neighbour's never), Started before Scheduled, then the most impactful type, then by EventId (the same
    answer whatever the document's order)."""
    own = [record for record in records if affects_vm(record.event, vm_name) is not False]
    if not own:
        return None
    return min(own, key=lambda record: (record.event.event_status != STATUS_STARTED, _impact(record.event.event_type),
                                        record.event.event_id))


def arms(records: Iterable[EventRecord], vm_name: str | None) -> bool:
    """Whether ``records`` hold an event of this VM's (any status): the detector is armed while one is listed."""
    return any(affects_vm(record.event, vm_name) is not False for record in records)


def felt(ended: float, seconds: float, records: Iterable[EventRecord], vm_name: str | None,
         throttled_seconds: float | None = None, steal_seconds: float | None = None) -> Pause:
    """The pause of ``seconds`` that ended at ``ended``, while ``records`` were listed; ``throttled_seconds``: how
    much the cgroup's throttled time grew over it, ``steal_seconds`` the steal time (each None where the kernel does
    not say)."""
    record = owner(records, vm_name)
    throttled = throttled_seconds is not None and throttled_seconds >= THROTTLED_SHARE * seconds
    if record is None:
        return Pause(ended, seconds, throttled=throttled, steal_seconds=steal_seconds)
    return Pause(ended, seconds, record.event.key, record.event.event_type, throttled, steal_seconds)


def fold(records: Mapping[str, EventRecord], pauses: Iterable[Pause]) -> Mapping[str, EventRecord]:
    """``records`` with each pause counted into its event's longest and total (throttling is not the VM's pause;
    a pause of an event no longer listed is left out: it ended before the pause was told)."""
    folded = dict(records)
    for pause in pauses:
        record = folded.get(pause.event_key) if pause.event_key is not None and not pause.throttled else None
        if record is not None:
            folded[record.event.key] = replace(record, longest_pause=max(record.longest_pause, pause.seconds),
                                               paused_seconds=record.paused_seconds + pause.seconds)
    return folded


def _impact(event_type: str) -> int:
    return IMPACT_ORDER.index(event_type) if event_type in IMPACT_ORDER else len(IMPACT_ORDER)
