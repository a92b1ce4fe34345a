"""The helpers every program shares: one cause walker, one log throttle, one shortener, one bind error."""

from __future__ import annotations

import socket

import pytest

from se_exporter.core.errors import ConfigError
from se_exporter.infra.azure.clients import MAX_CAUSES, causes, classify, describe
from se_exporter.infra.http_server import bind
from se_exporter.infra.logs import Throttle, redact, shorten
from se_exporter.infra.options import Listen


class Wrapped(Exception):
    def __init__(self, message: str, inner: BaseException | None = None, os_error: OSError | None = None) -> None:
        super().__init__(message)
        self.inner_exception = inner
        self.os_error = os_error


def test_the_cause_walker_follows_every_wrapping_once() -> None:
    """Python's chain, azure-core's inner_exception and aiohttp's os_error are all walked, each error once."""
    refused = ConnectionRefusedError(111, "Connection refused")
    outer = Wrapped("storage failed", inner=Wrapped("transport", os_error=refused))
    try:
        raise outer from outer  # a cycle must end
    except Wrapped as error:
        found = list(causes(error))
    assert refused in found and len(found) == len({id(e) for e in found}) == 3


def test_the_cause_walker_stops_at_max_causes_on_a_long_chain() -> None:
    """A chain of 1,000 wrappings (an SDK retrying and wrapping each failure) is walked only MAX_CAUSES deep."""
    error: BaseException = ConnectionRefusedError(111, "Connection refused")
    for depth in range(1000):
        error = Wrapped(f"attempt {depth}", inner=error)
    assert len(list(causes(error))) == MAX_CAUSES


def test_a_wrapped_refusal_is_a_connection_error_and_described_on_one_line() -> None:
    """classify looks at the error itself for a connection failure; describe keeps one redacted line."""
    assert classify(ConnectionRefusedError()) == "connection"
    assert describe(RuntimeError("first line SharedAccessKey=abc\nsecond")) == "first line SharedAccessKey=<redacted>"


@pytest.mark.parametrize(("text", "shown"), [
    ("export failing (http://otel:pa55@10.0.0.1:4318/v1/traces)", "export failing (http://otel:<redacted>@10.0.0.1:4318/v1/traces)"),
    ("https://:pa55@host", "https://:<redacted>@host"),
    ("http://user@host:4318 and http://host/a:b@c", "http://user@host:4318 and http://host/a:b@c"),
    # A password as people paste it, unencoded, inside an error's repr: hidden whole, whatever it holds.
    ("'http://u:p@ss@host:99999' is not a URL", "'http://u:<redacted>@host:99999' is not a URL"),
    ("'http://u:pa/ss?x#y@host' is not a URL", "'http://u:<redacted>@host' is not a URL"),
    ('"http://u:it\'s@host?q" must be a base URL', '"http://u:<redacted>@host?q" must be a base URL'),
    ('{"url": "grpc://u:pw@h:4317", "next": "x"}', '{"url": "grpc://u:<redacted>@h:4317", "next": "x"}'),
    ("sb://ns.servicebus.windows.net:5671/ and https://a.blob.core.windows.net/?sv=1&sig=abc%2B&se=2",
     "sb://ns.servicebus.windows.net:5671/ and https://a.blob.core.windows.net/?sv=1&sig=<redacted>&se=2"),
])
def test_a_urls_password_is_redacted_and_nothing_else(text: str, shown: str) -> None:
    """The password of a URL's userinfo (to the last @ before a blank) and a SAS signature become <redacted>;
    a user name, a host, a port and a path stay."""
    assert redact(text) == shown


def test_the_throttle_allows_one_line_per_key_per_interval() -> None:
    """A repeating line is logged at most once per interval for its key; other keys are not held back."""
    throttle = Throttle(60.0)
    assert throttle.due("a", 100.0)
    assert not throttle.due("a", 159.0)
    assert throttle.due("b", 159.0)
    assert throttle.due("a", 160.0)


def test_shorten_says_it_cut() -> None:
    assert shorten("abc", 3) == "abc"
    assert shorten("abcd", 3) == "abc..."


def test_a_taken_port_is_one_configuration_error_naming_listen() -> None:
    """Every program's bind failure reads the same: --listen, the address, the OS's reason."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = Listen("127.0.0.1", taken.getsockname()[1])

        def make() -> None:
            with socket.socket() as again:
                again.bind((listen.host, listen.port))

        with pytest.raises(ConfigError, match=r"^--listen 127\.0\.0\.1:\d+: cannot listen there"):
            bind(listen, make)


@pytest.mark.parametrize(("host", "url"), [
    ("", "http://127.0.0.1:9090/metrics"),
    ("0.0.0.0", "http://127.0.0.1:9090/metrics"),  # noqa: S104 - a wildcard to display, nothing binds here
    ("::", "http://127.0.0.1:9090/metrics"),
    ("::1", "http://[::1]:9090/metrics"),
    ("10.1.2.3", "http://10.1.2.3:9090/metrics"),
])
def test_run_and_fleet_show_one_metrics_url_for_a_listener(host: str, url: str) -> None:
    """A wildcard listener is shown as loopback, an IPv6 host in brackets: the start-up line's URL works as shown."""
    assert Listen(host, 8080).metrics_url(9090) == url
