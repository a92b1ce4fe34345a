"""The HTTP edge towards IMDS: GET only, no proxy, no redirects, explicit timeouts, bounded bodies.

IMDS is a link-local service on the VM itself: never through a proxy (IMDS rejects proxied requests, and a proxy
would see our traffic), never following a redirect (something between us and IMDS is lying), never anything but
GET. What each fault becomes is the README's "Faults, throttling, first call" table: one deadline per request
(``--imds-timeout``, or ``--first-call-timeout`` until Scheduled Events has answered once), the body taken exactly
as sent (the bytes forwarded must be the bytes IMDS returned), every failure one of the ``ImdsError`` classes the
poll loop counts.
"""

from __future__ import annotations

import email.utils
import json
import time
from urllib.parse import urlencode, urlsplit

from se_exporter import __version__
from se_exporter.core.errors import (
    ImdsConnectionError,
    ImdsError,
    ImdsHttpError,
    ImdsThrottled,
    ImdsTimeout,
    InvalidDocument,
)
from se_exporter.core.model import VmIdentity
from se_exporter.sidecar.transport import Answer, KeepAliveTransport, TimeoutException, TransportError

SCHEDULED_EVENTS_PATH = "/metadata/scheduledevents"
COMPUTE_PATH = "/metadata/instance/compute"
COMPUTE_API_VERSION = "2021-02-01"
USER_AGENT = f"se-exporter/{__version__}"
ERROR_BODY_BYTES = 4096  # of a 400 or 404 answer: enough for IMDS's error and its newest-versions list


# identity: RFC 9110 says a request without Accept-Encoding accepts any coding; we want the bytes as they are.
HEADERS = {"Metadata": "true", "User-Agent": USER_AGENT, "Accept-Encoding": "identity"}


class ImdsClient:
    """Reads Scheduled Events and compute metadata from one IMDS base URL."""

    def __init__(
        self,
        transport: KeepAliveTransport,
        base_url: str,
        api_version: str,
        timeout: float,
        first_call_timeout: float,
        max_body_bytes: int,
    ) -> None:
        self._transport = transport
        base = self._base = base_url.rstrip("/")
        # Worked out once per api-version: the URLs never change, and the hot path should not rebuild them per poll.
        self._compute_url = f"{base}{COMPUTE_PATH}?{urlencode({'api-version': COMPUTE_API_VERSION})}"
        parts = urlsplit(base)
        self._origin = (parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        self._cut = len(base) - len(parts.path)
        self._targets = {self._compute_url: self._compute_url[self._cut:]}
        self._events_urls: dict[str, str] = {}
        self.events_url = self._url_for(api_version)  # Scheduled Events, of the api-version last asked for
        self._headers = [("Host", parts.netloc.rpartition("@")[2]), *HEADERS.items()]
        self._timeout = timeout
        self._first_call_timeout = first_call_timeout
        self._max_body_bytes = max_body_bytes
        self._answered = False

    def _url_for(self, api_version: str) -> str:
        url = self._events_urls.get(api_version)
        if url is None:  # a handful of versions at most: the ones the poll loop negotiates between
            url = f"{self._base}{SCHEDULED_EVENTS_PATH}?{urlencode({'api-version': api_version})}"
            self._events_urls[api_version] = url
            self._targets[url] = url[self._cut:]
        return url

    @property
    def current_timeout(self) -> float:
        """The first Scheduled Events call may take up to two minutes because it switches that service
        on, so until it has answered once we wait ``first_call_timeout`` instead of ``timeout``. (Other
        IMDS endpoints answering says nothing about Scheduled Events being enabled.)"""
        return self._timeout if self._answered else self._first_call_timeout

    def scheduled_events(self, api_version: str | None = None) -> bytes:
        """The raw body of one Scheduled Events answer (HTTP 200) for ``api_version`` (default: the one given at
        construction, or last asked for), or an ``ImdsError``."""
        if api_version is not None:
            self.events_url = self._url_for(api_version)
        return self._get(self.events_url, self.current_timeout)

    def compute(self) -> VmIdentity:
        body = self._get(self._compute_url, self._timeout)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise InvalidDocument("compute metadata is not JSON we can read") from None
        if not isinstance(data, dict):
            raise InvalidDocument("compute metadata is not a JSON object")
        # A field of the wrong type is an invalid answer (warned once, retried), not an empty identity kept for good.
        wrong = [key for key in VmIdentity.COMPUTE_KEYS if key in data and not isinstance(data[key], str)]
        if wrong:
            raise InvalidDocument(f"compute metadata has fields that are not strings: {', '.join(wrong)}")
        return VmIdentity.from_compute(data)

    def _get(self, url: str, timeout: float) -> bytes:
        try:
            # The timeout bounds each step (connect, every read) and, as the total, the whole exchange. Straight to
            # the transport, which never follows a redirect (``transport.py``).
            answer = self._transport.get(self._origin, self._targets[url], self._headers, timeout, total=timeout)
            try:
                if url is self.events_url:
                    self._answered = True
                if answer.status != 200:
                    raise _status_error(answer, _error_body(answer) if answer.status in (400, 404) else b"")
                return self._read_bounded(answer)
            finally:
                answer.close()
        except TimeoutException as exc:
            raise ImdsTimeout(f"no complete answer within {timeout:g} s ({type(exc).__name__})") from None
        except TransportError as exc:
            raise ImdsConnectionError(f"{type(exc).__name__}: {exc or 'connection failed'}") from None

    def _read_bounded(self, answer: Answer) -> bytes:
        # A captive portal or a broken proxy can answer anything; never hold more than the cap.
        encoding = answer.header("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            raise InvalidDocument(f"body is {_printable(encoding)}-encoded although identity was asked for; "
                                  "refused unread (a compressed body is not the document IMDS serves)")
        declared = answer.header("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            raise InvalidDocument(f"body of {int(declared)} bytes exceeds the {self._max_body_bytes}-byte cap")
        chunks: list[bytes] = []
        size = 0
        for chunk in answer:  # identity only (checked above), so these are the bytes as sent
            size += len(chunk)
            if size > self._max_body_bytes:
                raise InvalidDocument(f"body exceeds the {self._max_body_bytes}-byte cap")
            chunks.append(chunk)
        return b"".join(chunks)


def _error_body(answer: Answer) -> bytes:
    """The first ``ERROR_BODY_BYTES`` of an error answer (the rest is left unread: the connection is then closed).
    A body that breaks off or stalls leaves what came: the status alone already says what it says."""
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in answer:
            chunks.append(chunk)
            size += len(chunk)
            if size >= ERROR_BODY_BYTES:
                break
    except TransportError:
        pass
    return b"".join(chunks)[:ERROR_BODY_BYTES]


def _status_error(response: Answer, body: bytes = b"") -> ImdsError:
    status = response.status
    if status == 429:
        retry_after = parse_retry_after(response.header("retry-after"), now=time.time())
        hint = "" if retry_after is None else f", Retry-After {retry_after:g} s"
        return ImdsThrottled(f"HTTP 429 Too Many Requests{hint}", retry_after)
    if 300 <= status < 400:
        location = _printable(response.header("location") or "?", 200)
        return ImdsHttpError(f"HTTP {status} redirect to {location} not followed", status)
    reason = _printable(response.reason or "error")
    return ImdsHttpError(f"HTTP {status} {reason}", status, body)


def _printable(text: str, limit: int = 40) -> str:
    """A header value for a message: cut short, non-printable characters escaped (repr without the quotes)."""
    return repr(text[:limit])[1:-1]


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from ``now``: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - now)
