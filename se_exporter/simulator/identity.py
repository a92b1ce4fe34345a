"""The simulator's managed identity: what IMDS' token endpoint answers, and the tokens it issues (docs/simulator.md).

The answer carries IMDS' fields, numbers as strings, as azure-identity's ImdsCredential reads them. Real tokens are
signed by Microsoft Entra ID with RS256; the simulator signs with HS256 (PyJWT) and a key of its own, which a test
peer (the Event Hubs test server's CBS) is given to check them with.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

IDENTITY_VERSIONS = ("2018-02-01", "2019-08-01")
TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a URL path, not a password
TENANT_ID = "4c1e0d2a-9b8f-4e7d-a6c5-b4a3c2d1e0f9"
SYSTEM_ASSIGNED = ("f6c8e6b1-0b1e-4c2a-9d7e-1a2b3c4d5e6f", "3f1e0c55-7a9b-4d2e-8c1f-5a6b7c8d9e0f")  # client, object
# A user-assigned identity attached to the sample VM: client id -> object (principal) id.
USER_ASSIGNED = {"0d6a3b1c-2e4f-4a5b-8c7d-9e0f1a2b3c4d": "7c2d4e6f-8a0b-4c1d-9e2f-3a4b5c6d7e8f"}


@dataclass
class IdentityService:
    """Issues tokens for the VM's identities; thread-safety is the caller's (the Simulator's lock)."""

    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    lifetime: int = 3599
    user_assigned: dict[str, str] = field(default_factory=lambda: dict(USER_ASSIGNED))
    issued: list[str] = field(default_factory=list)  # every token handed out, for leak checks in tests
    failures: int = 0  # the next N requests fail with ``failure_status``
    failure_status: int = 500

    def token(self, query: Mapping[str, str], now: float, vm_resource_id: str) -> tuple[int, dict[str, str]]:
        """The endpoint's status and answer: a token, or IMDS' error for a failing or refused request."""
        if self.failures > 0:
            self.failures -= 1
            return self.failure_status, {"error": "unknown_error",
                                         "error_description": "simulated token endpoint failure"}
        resource = query.get("resource", "")
        if not resource:
            return 400, {"error": "invalid_request", "error_description": "Required audience parameter not specified"}
        client_id, object_id = SYSTEM_ASSIGNED
        chosen = query.get("client_id") or query.get("object_id") or query.get("msi_res_id")
        if chosen:
            by_object = {principal: client for client, principal in self.user_assigned.items()}
            if chosen in self.user_assigned:
                client_id, object_id = chosen, self.user_assigned[chosen]
            elif chosen in by_object:
                client_id, object_id = by_object[chosen], chosen
            else:
                return 400, {"error": "invalid_request", "error_description": "Identity not found"}
        issued_at = int(now)
        expires_on = issued_at + self.lifetime
        claims = {"aud": resource, "iss": f"https://sts.windows.net/{TENANT_ID}/", "iat": issued_at,
                  "nbf": issued_at, "exp": expires_on, "appid": client_id, "oid": object_id, "sub": object_id,
                  "tid": TENANT_ID, "xms_mirid": vm_resource_id, "uti": secrets.token_urlsafe(16)}
        import jwt  # noqa: PLC0415 - only when a token is asked for

        token = jwt.encode(claims, self.key, algorithm="HS256")
        self.issued.append(token)
        return 200, {"access_token": token, "client_id": client_id, "expires_in": str(self.lifetime),
                     "expires_on": str(expires_on), "ext_expires_in": str(self.lifetime),
                     "not_before": str(issued_at), "resource": resource, "token_type": "Bearer"}

