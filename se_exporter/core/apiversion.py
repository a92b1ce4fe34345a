"""Which Scheduled Events api-version to ask for, and which event types and fields each version lists.

``--api-version auto`` and its fallback are docs/events.md's ("api-version negotiation"). Pure values, no I/O, no
clock: the caller passes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from se_exporter.core.model import EVENT_FIELD, EVENT_TYPES, PREEMPT, SPOT_REBALANCE

AUTO = "auto"
NEWEST = "2024-07-09"
FALLBACK = "2020-07-01"
RETRY_NEWEST_SECONDS = 3600.0
# Every Scheduled Events api-version, oldest first (Azure docs, "Version and region availability"; 2024-07-09 from
# the Spot eviction-risk notification pages).
VERSIONS = ("2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01",
            NEWEST)
# The version that first lists a type; the others are listed by every version.
TYPE_SINCE = {PREEMPT: "2017-11-01", "Terminate": "2019-01-01", SPOT_REBALANCE: NEWEST}


def lists_type(api_version: str, event_type: str) -> bool:
    """Whether a document of ``api_version`` can list ``event_type`` (versions compare as ISO dates)."""
    since = TYPE_SINCE.get(event_type)
    return since is None or api_version >= since


def lists_field(api_version: str, json_name: str) -> bool:
    """Whether an event of an ``api_version`` document carries the field ``json_name`` (``EventField.since``)."""
    return api_version >= EVENT_FIELD[json_name].since


def unlisted_types(api_version: str) -> frozenset[str]:
    """The documented types a document of ``api_version`` cannot list: their absence from it says nothing."""
    return frozenset(event_type for event_type in EVENT_TYPES if not lists_type(api_version, event_type))


def refuses_version(status: int, body: bytes) -> bool:
    """IMDS's answer means "this api-version is not served here": a 404, or a 400 whose body names the
    api-version. Anything else (a 5xx, a 429, a 400 about the Metadata header) is not a version answer."""
    return status == 404 or (status == 400 and b"api-version" in body.lower())


@dataclass(frozen=True)
class VersionChoice:
    """What the poll loop asks for. ``pinned``: the one version given; else ``in_use`` is the version of the last
    answer (``NEWEST`` until one came), and ``retry_at`` when the newer version is asked for again (None while on
    it)."""

    pinned: str | None = None
    in_use: str = NEWEST
    retry_at: float | None = None

    @classmethod
    def from_setting(cls, setting: str) -> VersionChoice:
        return cls() if setting == AUTO else cls(pinned=setting, in_use=setting)

    @property
    def negotiates(self) -> bool:
        return self.pinned is None

    def to_ask(self, now: float) -> str:
        """The version this poll asks for first."""
        if self.pinned is not None:
            return self.pinned
        if self.in_use != NEWEST and self.retry_at is not None and now >= self.retry_at:
            return NEWEST
        return self.in_use

    def refused(self, version: str, now: float) -> VersionChoice:
        """IMDS said it does not serve ``version``: fall back, and try the newer one again later."""
        if self.pinned is not None or version == FALLBACK:
            return self
        return replace(self, in_use=FALLBACK, retry_at=now + RETRY_NEWEST_SECONDS)

    def retry_failed(self, now: float) -> VersionChoice:
        """Asking for the newer version again failed for another reason (an outage): try again a period later."""
        return self if self.pinned is not None else replace(self, retry_at=now + RETRY_NEWEST_SECONDS)

    def answered(self, version: str) -> VersionChoice:
        """IMDS answered ``version`` with a document: it is the one in use."""
        if self.pinned is not None or version == self.in_use:
            return self
        return replace(self, in_use=version, retry_at=None if version == NEWEST else self.retry_at)
