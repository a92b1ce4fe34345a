"""Two `se-exporter fleet` replicas reading both streams, as the fleet writes the platform's series.

The gauges are written by the core's own ``PlatformCollector`` from a ``PlatformPicture`` and a ``Reconciler`` fed
with Event Grid messages (the spec's example, varied) and sidecars' VMs, so every coverage state comes out of the
real reconciliation. What each replica writes follows the fleet's rules over replicas (README, "The platform
stream's series, per replica"): ``platform_event_info`` of an EventId only by the replica that shows its home
platform partition; ``platform_event_vms`` by every replica, counting the VMs it judged, i.e. the VMs it shows, and
``no_sidecar`` only by a replica that shows every partition of every hub; so the fleet's figure is the sum over the
replicas of ``platform_event_vms`` and one replica's ``platform_event_info`` per EventId. The counters are those
the contract names, each EventId's counted by its home replica.

Two moments: ``split()``, the steady state (A shows sidecar partition P0 and is home to E-fz, E-done and E-term; B
shows P1 and is home to E-big and E-dark; neither judges ``no_sidecar``), and ``handover()``, where A still shows
every partition of both hubs (so it judges every VM, ``no_sidecar`` included) while B already shows P1 and the
platform partition of E-big and E-dark: for that moment P1's VMs are judged by both. The rules' promtool tests
(tests/fleet/test_alerts.py) and the dashboard and rules on a real Prometheus (tests/integration/
test_fleet_two_streams.py) read these expositions; the constants below are the fleet's figures in the split.

The story, in scenario seconds from T0 (the first announcement):

* ``E-big``: a Reboot Scheduled for seven VMs of scale set ``big``: three sidecars listed it (observed), two live
  sidecars did not (missed: big_3 in P0, big_8 in P1), big_4 had not read IMDS since before the announcement
  (imds_unreachable), big_5 has no sidecar.
* ``E-fz``: a Freeze Started on two VMs of ``ss``, one observed, one missed.
* ``E-dark``: a Redeploy Scheduled for the two VMs of availability set ``dark``, neither with a sidecar.
* ``E-done``: a Reboot of ``big`` that ran 120 s on two VMs and Completed (240 s of impact); one VM's sidecar had
  missed it while it was open.
* ``E-term``: a Terminate Scheduled for one VM of ``ss``, observed.
* ``E-ghost``: listed by a sidecar of ``ss`` (a scope that publishes), never announced.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from se_exporter.fleet import collector
from se_exporter.fleet.message import Imds, VmState
from se_exporter.fleet.platform.counting import Counted, judge, top_up, top_up_unannounced
from se_exporter.fleet.platform.coverage import Coverage, Reconciler, ReconcileSettings
from se_exporter.fleet.platform.reader import read_platform
from se_exporter.fleet.platform.records import PlatformPicture, PlatformRecord
from tests.fleet.platform_helpers import MAX, T0, body, grid, platform_text, vm

SUB = "00000000-0000-0000-0000-000000000000"
EXPIRY, GRACE = 600.0, 60.0
NOW = T0 + 900  # when the replicas are scraped
LAG_BUCKETS = collector.LAG_BUCKETS  # the fleet's own: what the panels and the lag check see
# What each announced EventId is: type, scope (kind in the ARM id, name), the VMs it names, and its statuses'
# times (seconds after T0). Every EventId but E-dark has its home platform partition on replica A.
EVENTS: dict[str, tuple[str, str, str, list[str], dict[str, float]]] = {
    "E-big": ("Reboot", "virtualMachineScaleSets", "big", [*(f"big_{i}" for i in range(6)), "big_8"],
              {"Scheduled": 0}),
    "E-fz": ("Freeze", "virtualMachineScaleSets", "ss", ["ss_0", "ss_1"], {"Scheduled": 0, "Started": 500}),
    "E-dark": ("Redeploy", "availabilitySets", "dark", ["dark_0", "dark_1"], {"Scheduled": 0}),
    "E-done": ("Reboot", "virtualMachineScaleSets", "big", ["big_6", "big_7"],
               {"Scheduled": 0, "Started": 300, "Completed": 420}),
    "E-term": ("Terminate", "virtualMachineScaleSets", "ss", ["ss_2"], {"Scheduled": 0}),
}
P0 = frozenset({"big_0", "big_1", "big_3", "ss_0", "ss_1", "ss_2"})  # the sidecars' partitions: their VMs
P1 = frozenset({"big_2", "big_4", "big_6", "big_7", "big_8"})
HOME_A = frozenset({"E-fz", "E-done", "E-term"})  # EventIds whose home platform partition each replica shows
HOME_B = frozenset({"E-big", "E-dark"})

# The fleet's figures in the split: each EventId once, its VMs summed over the replicas that judged them.
OPEN_EVENTS = 4.0  # E-big, E-fz, E-dark, E-term
ANNOUNCED: dict[tuple[str, ...], tuple[str, str, float, float, float, float]] = {
    # event_id -> event_type, event_status, then the VMs observed, missed, imds_unreachable, no_sidecar
    ("E-big",): ("Reboot", "Scheduled", 3, 2, 1, 0),
    ("E-fz",): ("Freeze", "Started", 1, 1, 0, 0),
    ("E-dark",): ("Redeploy", "Scheduled", 0, 0, 0, 0),
    ("E-done",): ("Reboot", "Completed", 1, 1, 0, 0),
    ("E-term",): ("Terminate", "Scheduled", 1, 0, 0, 0),
}
BLIND_ROWS: dict[tuple[str, ...], float] = {  # (event_id, coverage) -> VMs, every pair not observed
    ("E-big", "missed"): 2.0, ("E-big", "imds_unreachable"): 1.0, ("E-fz", "missed"): 1.0, ("E-done", "missed"): 1.0}
UNANNOUNCED: dict[tuple[str, ...], float] = {("Reboot",): 1.0}  # the test VMs list every EventId as a Reboot
IMPACT: dict[tuple[str, ...], float] = {("Reboot", "big", "westeurope"): 240.0}


def _message(event_id: str, status: str) -> bytes:
    event_type, kind, scope, resources, times = EVENTS[event_id]
    event = grid(status, event_id=event_id, at=T0 + times[status], resources=resources, event_type=event_type)
    for field in ("subject",):
        event[field] = event[field].replace("virtualMachineScaleSets/web", f"{kind}/{scope}")
    info = event["data"]["resourceInfo"]
    info["id"] = info["id"].replace("virtualMachineScaleSets/web", f"{kind}/{scope}")
    return body([event])


def _vms(seen: float, early: bool = False) -> list[VmState]:
    """The sidecars heard from at ``seen``: who listed what (early on, big_7 listed E-done, which it no longer
    shows once it ended), and big_4's, which has not read IMDS since before T0."""
    blind = Imds(observed_at=T0 + 30, last_success=T0 - 200, failing=False)
    return [vm("big_0", ("E-big",), seen, "big"), vm("big_1", ("E-big",), seen, "big"),
            vm("big_2", ("E-big",), seen, "big"), vm("big_3", (), seen, "big"),
            vm("big_4", (), seen, "big", imds=blind),
            vm("big_6", (), seen, "big"), vm("big_7", ("E-done",) if early else (), seen, "big"),
            vm("big_8", (), seen, "big"),
            vm("ss_0", ("E-fz", "E-ghost"), seen, "ss"), vm("ss_1", (), seen, "ss"),
            vm("ss_2", ("E-term",), seen, "ss")]


class Fleet:
    """The platform picture and its reconciliation after the story, with what the counters add for each."""

    def __init__(self) -> None:
        picture = PlatformPicture()
        reconciler = Reconciler(ReconcileSettings(EXPIRY, GRACE))
        self.statuses: list[tuple[str, str, str]] = []  # (event_id, event_type, status) learnt
        self.impact: list[tuple[str, str, str, str, float]] = []  # (event_id, type, scope, location, seconds)
        self.missed: list[tuple[str, str]] = []  # (event_type, reason), as each EventId's home counts them
        self.unannounced: list[str] = []
        self.lags: list[float] = []
        self.lagged: list[tuple[str, float]] = []  # (event_id, lag): its home observes it
        self._counted: dict[str, Counted] = {}
        self._judged: dict[str, dict[str, tuple[str | None, float | None]]] = {}  # the replicas' judgement merged
        self._apply(picture, [(event_id, "Scheduled") for event_id in EVENTS], T0 + 5)
        self._reconcile(reconciler, picture.records(), _vms(T0 + 90, early=True), T0 + 90)
        self._apply(picture, [(event_id, status) for event_id, (*_, times) in EVENTS.items() for status in times
                              if status != "Scheduled"], NOW - 60)
        self.records = picture.records()
        self.coverage = self._reconcile(reconciler, self.records, _vms(NOW - 30), NOW)

    def _apply(self, picture: PlatformPicture, messages: list[tuple[str, str]], now: float) -> None:
        for event_id, status in messages:
            read = read_platform(_message(event_id, status), MAX, now)
            assert read is not None
            for event in read.events:
                applied = picture.apply(event, now)
                # What the EventId's home adds for it (``counting.top_up``; one picture here, so its record).
                for increment in top_up(self._counted.setdefault(event_id, Counted()), applied.record) \
                        if applied.record else ():
                    if increment.counter == "platform_events":
                        self.statuses.append((event_id, event.event_type, increment.labels[1]))
                    elif increment.counter == "impact_seconds":
                        self.impact.append((event_id, event.event_type, event.scope_name, event.location,
                                            increment.amount))

    def _reconcile(self, reconciler: Reconciler, records: list[PlatformRecord], vms: list[VmState],
                   now: float) -> tuple[Coverage, ...]:
        result = reconciler.update(records, vms, now)
        by_key = {record.key: record for record in records}
        nowhere: list[Coverage] = []
        for row in result.coverage:  # one replica judging every VM: its judgement is the merged one
            if row.coverage == "no_sidecar":
                nowhere.append(row)
                continue
            verdicts = self._judged.setdefault(row.event_key, {})
            verdicts[row.vm_name] = judge(verdicts.get(row.vm_name, (None, None)), row.coverage, row.lag)
        for key in {*self._judged, *(row.event_key for row in nowhere)}:  # what each home adds (``top_up``)
            record = by_key[key]
            found = {**self._judged.get(key, {}),
                     **{row.vm_name: ("no_sidecar", None) for row in nowhere if row.event_key == key}}
            for increment in top_up(self._counted.setdefault(record.event.event_id, Counted()), record, found):
                if increment.counter == "missed_events":
                    self.missed.append((increment.labels[0], increment.labels[1]))
                elif increment.counter == "announcement_lag":
                    self.lags.append(increment.amount)
                    self.lagged.append((record.event.event_id, increment.amount))
        for key, event_type, _name in result.listed:
            self.unannounced += [increment.labels[0] for increment in top_up_unannounced(
                self._counted.setdefault(key, Counted()), event_type)]
        return tuple(nowhere) + tuple(
            Coverage(key, by_key[key].event.event_id, by_key[key].event.event_type, name,
                     "observed" if lag is not None else str(reason), lag)
            for key, judged in self._judged.items() for name, (reason, lag) in judged.items())

    def missed_of(self, event_ids: frozenset[str]) -> list[tuple[str, str]]:
        """(event_type, reason) of every pair of these EventIds not observed: each counted once (the reconciler's
        own counts carry no EventId; a pair keeps the coverage it was counted under, so the two agree)."""
        found = [(row.event_type, row.coverage) for row in self.coverage
                 if row.event_id in event_ids and row.coverage != "observed"]
        return found


def counters(fleet: Fleet, home: frozenset[str], counted: bool) -> str:
    """The counters and the histogram of one replica, for the EventIds whose home partition it shows, at zero
    before the story or after it (``counted``): every label value the story reaches is there from the start, as
    the fleet creates closed sets at zero. The unannounced EventId falls to replica A, each lag to its EventId's
    home."""
    registry = CollectorRegistry()
    statuses = Counter("azure_scheduled_fleet_platform_events", "h", ["event_type", "event_status"],
                       registry=registry)
    Counter("azure_scheduled_fleet_platform_duplicates", "h", registry=registry)
    missed = Counter("azure_scheduled_fleet_missed_events", "h", ["event_type", "reason"], registry=registry)
    unannounced = Counter("azure_scheduled_fleet_unannounced_events", "h", ["event_type"], registry=registry)
    lag = Histogram("azure_scheduled_fleet_announcement_lag_seconds", "h", buckets=LAG_BUCKETS, registry=registry)
    impact = Counter("azure_scheduled_fleet_impact_seconds", "h", ["event_type", "scope_name", "location"],
                     registry=registry)
    for event_type in {EVENTS[event_id][0] for event_id in home}:
        for reason in ("missed", "imds_unreachable", "no_sidecar"):
            missed.labels(event_type, reason)
    unannounced.labels("Reboot")
    for event_id, event_type, status in fleet.statuses:
        child = statuses.labels(event_type, status)
        if counted and event_id in home:
            child.inc()
    for event_id, event_type, scope, location, seconds in fleet.impact:
        child = impact.labels(event_type, scope, location)
        if counted and event_id in home:
            child.inc(seconds)
    if counted:
        for event_type, reason in fleet.missed_of(home):
            missed.labels(event_type, reason).inc()
        if home == HOME_A:
            for event_type in fleet.unannounced:
                unannounced.labels(event_type).inc()
        for event_id, value in fleet.lagged:
            if event_id in home:
                lag.observe(value)
    return generate_latest(registry).decode()


def exposition(fleet: Fleet, informed: frozenset[str], home: frozenset[str], shown: frozenset[str] | None,
               counted: bool) -> str:
    """One replica's platform families: info of the EventIds whose home partition it shows (``informed``), VM
    counts of every record for the VMs it shows (``None``: every partition of every hub, so ``no_sidecar`` too),
    then the counters of the EventIds it counted (``home``)."""
    judged = [row for row in fleet.coverage if shown is None or (row.vm_name in shown and row.coverage != "no_sidecar")]
    text = platform_text(fleet.records, judged)
    homes = {f'event_id="{event_id}"' for event_id in informed}
    kept = [line for line in text.split("\n") if not line.startswith("azure_scheduled_fleet_platform_event_info{")
            or any(ident in line for ident in homes)]
    return "\n".join(kept) + counters(fleet, home, counted)


def split(counted: bool = True) -> tuple[str, str]:
    """The steady state: A shows P0 and the home partition of E-fz, E-done and E-term; B shows P1 and that of E-big
    and E-dark. Every pair with a sidecar is judged once; no_sidecar by neither (neither shows everything)."""
    fleet = Fleet()
    return exposition(fleet, HOME_A, HOME_A, P0, counted), exposition(fleet, HOME_B, HOME_B, P1, counted)


def handover(counted: bool = True) -> tuple[str, str]:
    """A hand-over's moment: A still shows every partition of both hubs (it judges every VM, no_sidecar too, and
    writes every info series); B already shows P1 and the home partition of E-big and E-dark (it judges P1's VMs
    and writes those two info series): P1's pairs are judged by both. The counters are the split's."""
    fleet = Fleet()
    return (exposition(fleet, HOME_A | HOME_B, HOME_A, None, counted),
            exposition(fleet, HOME_B, HOME_B, P1, counted))


def ended(text: str, event_id: str, status: str = "Completed") -> str:
    """An exposition with one EventId's status moved on (its info series' event_status)."""
    return "\n".join(line.replace('event_status="Scheduled"', f'event_status="{status}"')
                     if line.startswith("azure_scheduled_fleet_platform_event_info") and f'event_id="{event_id}"'
                     in line else line for line in text.split("\n"))
