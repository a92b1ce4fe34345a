"""Never approve, proven by behaviour: the IMDS client and its transport can send nothing but GET, and no other
connection of any program can reach the IMDS address (``infra/outbound.py``), however the address is written.
Nothing here reaches IMDS (see tests/support/imds_guard_probe.py)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

from se_exporter.infra.outbound import is_imds
from se_exporter.sidecar.imds import COMPUTE_PATH, SCHEDULED_EVENTS_PATH, USER_AGENT, ImdsClient
from se_exporter.sidecar.transport import KeepAliveTransport
from tests.conftest import Reliability, SimulatorFactory
from tests.support.imds_guard_probe import SPELLINGS


def test_no_program_can_reach_imds_but_through_its_get_only_clients(reliability: Reliability) -> None:
    """After any command started (``cli.main``), a POST to IMDS through requests, urllib, http.client, aiohttp, the
    managed identity's transport or a bare socket, with the address in any spelling, is refused before a connection
    is made (tests/support/imds_guard_probe.py, in a process of its own)."""
    result = subprocess.run([sys.executable, "-m", "tests.support.imds_guard_probe"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout.splitlines()[-1])
    # aiohttp (yarl) itself refuses a URL whose IPv4 address is not written canonically: nothing sent either.
    unparsed = {case for case, outcome in outcomes.items() if outcome.startswith("InvalidUrlClientError")}
    assert unparsed <= {"aiohttp 2852039166", "aiohttp 0251.0376.0251.0376"}
    assert len(outcomes) == 30 and {case: o for case, o in outcomes.items() if o != "refused"} == \
        {case: outcomes[case] for case in unparsed}
    reliability("Security", "a POST to IMDS (5 spellings of its address) through requests, urllib, http.client, "
                "aiohttp, the managed identity's transport and a bare socket, after a command started",
                "all 30 refused before connecting; the IMDS client sends GET only, through a transport without a "
                "method parameter")


def test_the_guard_recognises_every_spelling_and_nothing_else() -> None:
    """The IMDS address in dotted, hexadecimal, decimal, octal, short and IPv6 forms is IMDS; its neighbours and
    loopback are not."""
    assert all(is_imds(host) for host in [*SPELLINGS, "169.254.43518", "::169.254.169.254", "169.254.169.254."])
    assert not any(is_imds(host) for host in ["169.254.169.253", "127.0.0.1", "::1", "localhost", "10.0.0.1"])


def test_the_imds_transport_takes_no_method() -> None:
    """The transport's one way to send is ``get``, which has no method parameter; the IMDS client reaches it only."""
    def public(cls: type) -> set[str]:
        return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}

    assert public(KeepAliveTransport) == {"get", "close"}
    assert "method" not in inspect.signature(KeepAliveTransport.get).parameters
    assert public(ImdsClient) == {"scheduled_events", "compute"}


def test_every_request_the_imds_client_sends_is_a_get(simulator: SimulatorFactory) -> None:
    """Through the sidecar's own transport to a real socket, the IMDS client's calls (Scheduled Events on its first
    and later timeouts, compute metadata) reach IMDS as GET and nothing else."""
    sim, server = simulator("live-migration")
    transport = KeepAliveTransport()
    client = ImdsClient(transport, server.url, "2020-07-01", timeout=5.0, first_call_timeout=10.0,
                        max_body_bytes=1 << 20)
    try:
        client.scheduled_events()
        client.scheduled_events()
        client.compute()
    finally:
        transport.close()
    sent = [(request.method, request.path) for request in sim.requests if request.user_agent == USER_AGENT]
    assert sent == [("GET", SCHEDULED_EVENTS_PATH), ("GET", SCHEDULED_EVENTS_PATH), ("GET", COMPUTE_PATH)]
