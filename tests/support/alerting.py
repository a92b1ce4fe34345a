"""Alerting on loopback: Debian's Alertmanager with the shipped configuration, and a webhook receiver that records
what a person would be paged with. Used by tests/integration/test_alerting.py and scripts/bench.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support.child_logs import attach
from tests.support.helpers import free_port, http_get, stop_process, wait_until

ROOT = Path(__file__).parents[2]
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ALERTMANAGER = "prometheus-alertmanager"  # Debian's name for the alertmanager binary


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} not found: `make system-deps` installs Debian's prometheus-alertmanager")
    return path


@dataclass(frozen=True)
class Notification:
    """One webhook POST from Alertmanager: which receiver, when it arrived, the payload (version 4)."""

    receiver: str
    received_at: float
    payload: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.payload["status"])

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload["alerts"])


class Webhook:
    """An HTTP receiver on 127.0.0.1 that records every notification; ``url(receiver)`` for each receiver."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        received = self._received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received(self.path.strip("/"), json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def _received(self, receiver: str, payload: dict[str, Any]) -> None:
        with self._lock:
            self.notifications.append(Notification(receiver, time.time(), payload))

    def url(self, receiver: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{receiver}"

    def received(self, **labels: str) -> list[Notification]:
        """Notifications with at least one alert carrying all of ``labels``."""
        with self._lock:
            found = list(self.notifications)
        return [n for n in found if any(all(a["labels"].get(k) == v for k, v in labels.items()) for a in n.alerts)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def shortened(config: dict[str, Any], webhook: Webhook, group_wait: str, group_interval: str) -> dict[str, Any]:
    """The shipped configuration with only what a test may change: every receiver's URL (to ``webhook``, one
    path per receiver) and every route's group_wait and group_interval. Routing, grouping, inhibition and the
    repeat intervals stay as shipped."""
    config = json.loads(json.dumps(config))  # a deep copy

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", group_wait), ("group_interval", group_interval)):
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    for receiver in config["receivers"]:
        for webhook_config in receiver.get("webhook_configs", []):
            webhook_config["url"] = webhook.url(receiver["name"])
    return config


class Alertmanager:
    """Debian's Alertmanager on 127.0.0.1:<free port> with its own storage; no cluster gossip (the cluster
    listener is off), nothing contacted but the receivers' URLs. Alertmanager has no update check."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_file = workdir / "alertmanager.yml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        check = subprocess.run([tool("amtool"), "check-config", str(self.config_file)], capture_output=True,
                               text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = workdir / "alertmanager.log"
        for _ in range(3):  # the free port may be taken between probe and bind; try another
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            self.url = f"http://{self.address}"
            with self.log.open("wb") as log:
                self.process = subprocess.Popen(
                    [tool(ALERTMANAGER), f"--config.file={self.config_file}", f"--storage.path={workdir / 'data'}",
                     f"--web.listen-address={self.address}", f"--web.external-url={self.url}",
                     "--cluster.listen-address=", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT)
            attach(f"Alertmanager (pid {self.process.pid})", self.log, lambda: self.process.poll() is None)
            ready = wait_until(lambda: self.process.poll() is not None or http_get(self.url + "/-/ready")[0] == 200,
                               timeout=30, what="Alertmanager to be ready")
            if self.process.poll() is None and ready:
                return
        raise AssertionError(f"Alertmanager did not start: {self.log.read_text()}")

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds now, with their state (active, suppressed and by what)."""
        status, body = http_get(f"{self.url}/api/v2/alerts")
        assert status == 200, body
        found = json.loads(body)
        return [a for a in found if all(a["labels"].get(k) == v for k, v in filters.items())]

    def stop(self) -> None:
        stop_process(self.process)
