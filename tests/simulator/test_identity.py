"""The simulator's managed identity endpoint, as Azure documents IMDS' (and as azure-identity reads it)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.identity import SYSTEM_ASSIGNED, TOKEN_PATH, USER_ASSIGNED
from se_exporter.simulator.server import Simulator, SimulatorServer, start
from tests.support.helpers import verify

NOW = 1_700_000_000.0
EVENTHUBS = "https://eventhubs.azure.net/"


@pytest.fixture
def served() -> Iterator[tuple[Simulator, SimulatorServer]]:
    sim = Simulator(scenarios.load("live-migration"), clock=lambda: NOW)
    server = start(sim)
    yield sim, server
    server.shutdown()
    server.server_close()


def token(server: SimulatorServer, metadata: bool = True, **params: str) -> httpx.Response:
    query = {"api-version": "2018-02-01", "resource": EVENTHUBS, **params}
    with httpx.Client(trust_env=False) as http:
        return http.get(server.url + TOKEN_PATH, params={k: v for k, v in query.items() if v},
                        headers={"Metadata": "true"} if metadata else {})


def test_a_token_for_the_system_assigned_identity(served: tuple[Simulator, SimulatorServer]) -> None:
    """The documented answer (numbers as strings); the JWT's audience is the resource, its identity the VM's."""
    sim, server = served
    response = token(server)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"access_token", "client_id", "expires_in", "expires_on", "ext_expires_in", "not_before",
                         "resource", "token_type"}
    assert (body["resource"], body["token_type"], body["client_id"]) == (EVENTHUBS, "Bearer", SYSTEM_ASSIGNED[0])
    assert (body["expires_in"], body["expires_on"]) == ("3599", str(int(NOW) + 3599))
    claims = verify(body["access_token"], sim.identity.key)
    assert (claims["aud"], claims["appid"], claims["oid"], claims["exp"]) == \
        (EVENTHUBS, SYSTEM_ASSIGNED[0], SYSTEM_ASSIGNED[1], int(NOW) + 3599)
    assert claims["xms_mirid"].endswith("/providers/Microsoft.Compute/virtualMachines/WestNO_0")
    assert sim.identity.issued == [body["access_token"]]


@pytest.mark.parametrize("chosen", ["client_id", "object_id"])
def test_a_user_assigned_identity_by_client_or_object_id(served: tuple[Simulator, SimulatorServer],
                                                          chosen: str) -> None:
    """client_id (or object_id) picks a user-assigned identity of the VM; the token is that identity's."""
    sim, server = served
    client_id, object_id = next(iter(USER_ASSIGNED.items()))
    response = token(server, **{chosen: client_id if chosen == "client_id" else object_id})
    assert response.status_code == 200 and response.json()["client_id"] == client_id
    assert verify(response.json()["access_token"], sim.identity.key)["oid"] == object_id


@pytest.mark.parametrize(("metadata", "params", "fragment"), [
    (False, {}, "metadata header"),
    (True, {"resource": ""}, "Required audience parameter not specified"),
    (True, {"client_id": "00000000-0000-0000-0000-000000000000"}, "Identity not found"),
    (True, {"api-version": "2017-01-01"}, "api-version is invalid"),
])
def test_refused_requests_are_400(served: tuple[Simulator, SimulatorServer], metadata: bool,
                                  params: dict[str, str], fragment: str) -> None:
    """No Metadata header, no resource, an identity the VM does not have, an unknown api-version: 400."""
    sim, server = served
    response = token(server, metadata=metadata, **params)
    assert response.status_code == 400
    assert fragment in json.dumps(response.json())
    assert sim.identity.issued == []


def test_lifetime_and_failures_are_settable(served: tuple[Simulator, SimulatorServer]) -> None:
    """POST /_simulator/identity shortens tokens and fails the next N requests with a status; all are recorded."""
    sim, server = served
    with httpx.Client(trust_env=False) as http:
        assert http.post(server.url + "/_simulator/identity", json={"lifetime": 5, "fail": 2, "status": 503}
                         ).status_code == 200
    assert [token(server).status_code for _ in range(3)] == [503, 503, 200]
    assert token(server).json()["expires_in"] == "5"
    assert len([r for r in sim.requests if r.path == TOKEN_PATH]) == 4


def test_a_token_verifies_only_with_the_simulators_key(served: tuple[Simulator, SimulatorServer]) -> None:
    """A token the simulator issued is refused with another key, or with its claims altered."""
    sim, server = served
    issued = token(server).json()["access_token"]
    with pytest.raises(ValueError, match="not a valid token"):
        verify(issued, b"another key of 32 bytes or more!")
    header, _payload, signature = issued.split(".")
    forged = token(server, resource="https://storage.azure.com").json()["access_token"].split(".")[1]
    with pytest.raises(ValueError, match="not a valid token"):
        verify(f"{header}.{forged}.{signature}", sim.identity.key)
