"""Settings of `se-exporter fleet`: the shared Event Hubs options, the checkpoint store, one line per mistake."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from se_exporter.cli import build_parser, main
from se_exporter.core.errors import ConfigError
from se_exporter.fleet.collector import FleetMetrics, PartitionCollector, PartitionView
from se_exporter.fleet.platform.exposition import PlatformCollector
from se_exporter.fleet.platform.service import LastReconciliation
from se_exporter.fleet.scrape import FleetExposition
from se_exporter.fleet.settings import FLEET_OPTIONS, FleetSettings, fleet_settings
from se_exporter.infra.options import Listen

HUB = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0;EntityPath=hub"
STORAGE = "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c3RvcmFnZXNlY3JldA==;EndpointSuffix=core.net"
BASE = {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB, "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": STORAGE}


def settings(argv: list[str], env: dict[str, str] | None = None) -> FleetSettings:
    return fleet_settings(build_parser().parse_args(["fleet", *argv]), BASE if env is None else env)


def test_defaults() -> None:
    """Its own port next to the sidecar's, the SDK's balancing defaults, 15 minutes of silence before expiry."""
    s = settings([])
    assert s.listen == Listen("", 10170)
    assert (s.consumer_group, s.checkpoint_container, s.starting_position) == ("$Default", "se-exporter-fleet",
                                                                               "earliest")
    assert (s.load_balancing_interval, s.ownership_timeout, s.checkpoint_interval, s.vm_expiry) == (
        30.0, 180.0, 10.0, 900.0)
    assert s.max_message_bytes == 1024 * 1024


def test_flags_and_environment_like_every_command() -> None:
    """A flag wins over SE_EXPORTER_*; the managed-identity variant needs no secret at all."""
    env = {"SE_EXPORTER_EVENTHUB_NAMESPACE": "ns.servicebus.windows.net", "SE_EXPORTER_EVENTHUB_NAME": "hub",
           "SE_EXPORTER_CHECKPOINT_ACCOUNT_URL": "https://acct.blob.core.windows.net/",
           "SE_EXPORTER_EVENTHUB_CLIENT_ID": "id-1", "SE_EXPORTER_FLEET_LISTEN": ":9999",
           "SE_EXPORTER_VM_EXPIRY": "60"}
    s = settings(["--vm-expiry", "120", "--load-balancing-interval", "5", "--consumer-group", "fleet"], env)
    assert (s.eventhub_namespace, s.checkpoint_account_url, s.storage_client_id) == (
        "ns.servicebus.windows.net", "https://acct.blob.core.windows.net", "id-1")
    assert (s.vm_expiry, s.listen, s.ownership_timeout, s.consumer_group) == (120.0, Listen("", 9999), 30.0, "fleet")


def test_a_ca_file_without_certificates_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--checkpoint-ca-file is read at start-up: a file that holds no PEM certificate is one line naming the flag."""
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    assert main(["fleet", "--checkpoint-ca-file", str(not_pem)], env=BASE) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--checkpoint-ca-file: '{not_pem}' holds no PEM certificate" in err, err


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {"SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": STORAGE}, "--eventhub-connection-string or --eventhub-namespace"),
    ([], {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": HUB}, "--checkpoint-connection-string or --checkpoint-account-url"),
    (["--checkpoint-account-url", "https://acct.blob.core.windows.net"], BASE, "(exactly one)"),
    (["--checkpoint-account-url", "http://acct.blob.core.windows.net"], {}, "is not an https URL"),
    (["--checkpoint-container", "Bad_Name"], BASE, "--checkpoint-container: 'Bad_Name' is not a container name"),
    (["--checkpoint-client-id", "x"], BASE, "--checkpoint-client-id needs --checkpoint-account-url"),
    (["--ownership-expiry", "10", "--load-balancing-interval", "10"], BASE, "must be longer than"),
    (["--starting-position", "yesterday"], BASE, "--starting-position: 'yesterday' is not earliest"),
    (["--vm-expiry", "0"], BASE, "--vm-expiry: '0' must be a positive number"),
    (["--listen", "nowhere"], BASE, "--listen: 'nowhere' is not HOST:PORT"),
    (["--checkpoint-ca-file", "/nonexistent/ca.pem"], BASE, "--checkpoint-ca-file: '/nonexistent/ca.pem' is not a "
                                                            "readable file"),
    ([], {**BASE, "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": "AccountName=acct;Sig=s3cr3tK3y"},
     "SE_EXPORTER_CHECKPOINT_CONNECTION_STRING: needs AccountKey"),
    *(([f"--consumer-group={group}"], BASE, f"--consumer-group: {group[:60]!r}") for group in (
        "../../x", "a/b", "a b", "x" * 5000, "x" * 51, "-x", "x.", "$default2", "")),
    (["--eventhub-name", "../hub"], BASE, "--eventhub-name: '../hub' is not an event hub name"),
    (["--eventhub-name", "h" * 257], BASE, "is not an event hub name: 1 to 256 letters"),
])
def test_bad_configuration_is_one_line_naming_the_setting(argv: list[str], env: dict[str, str], message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 and one line on stderr that says what to fix, and never the keys."""
    assert main(["fleet", *argv], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    for secret in ("c2VjcmV0", "c3RvcmFnZXNlY3JldA", "s3cr3tK3y"):
        assert secret not in err


@pytest.mark.parametrize("group", ["$Default", "fleet", "a", "x" * 50, "team.fleet-2_b"])
def test_consumer_groups_event_hubs_allows_are_accepted(group: str) -> None:
    """The built-in $Default and names within Event Hubs' rules (1-50 letters, digits, '.', '-', '_')."""
    assert settings(["--consumer-group", group, "--eventhub-name", "hub.name-1_x"]).consumer_group == group


def test_every_fleet_setting_and_metric_is_in_the_reference() -> None:
    """Each flag and variable of `fleet`, and each metric family it can expose, has its row in docs/reference.md."""
    readme = (Path(__file__).parent.parent.parent / "docs" / "reference.md").read_text()
    for option in FLEET_OPTIONS:
        assert f"`{option.flag} {option.metavar}`" in readme, option.flag
        assert f"`{option.env}`" in readme, option.env
    registry = CollectorRegistry()
    FleetMetrics(registry)
    registry.register(PartitionCollector(lambda: {"0": PartitionView(1, 1, 1)}, lambda: 1))
    registry.register(PlatformCollector(LastReconciliation))
    names = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    names |= {family.name for family in FleetExposition([]).describe()}
    assert len(names) > 20
    for name in names:
        assert f"| `{name}` |" in readme, name


PLATFORM = HUB.replace("EntityPath=hub", "EntityPath=platform")


def test_the_platform_hub_has_its_own_flags_defaults_and_environment() -> None:
    """--platform-eventhub-* name the platform's hub beside the sidecars'; retention 1 h and grace 60 s by default."""
    s = settings(["--platform-retention", "600"], {**BASE, "SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING": PLATFORM,
                                                   "SE_EXPORTER_PLATFORM_CONSUMER_GROUP": "fleet"})
    assert [hub.role for hub in s.hubs] == ["sidecar", "platform"]
    assert (s.platform_consumer_group, s.platform_retention, s.reconcile_grace) == ("fleet", 600.0, 60.0)
    assert s.hubs[1].connection_string == PLATFORM and s.hubs[1].consumer_group == "fleet"
    assert "SharedAccessKey" not in repr(s)


def test_a_fleet_of_the_platform_stream_alone_needs_no_sidecar_hub() -> None:
    """Agentless: the platform's hub alone (by namespace and managed identity) is a complete configuration."""
    s = settings(["--platform-eventhub-namespace", "ns.servicebus.windows.net", "--platform-eventhub-name", "grid",
                  "--eventhub-client-id", "id-1"], {"SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": STORAGE})
    assert [(hub.role, hub.namespace, hub.name) for hub in s.hubs] == [("platform", "ns.servicebus.windows.net",
                                                                         "grid")]
    assert s.eventhub_client_id == "id-1"


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {"SE_EXPORTER_CHECKPOINT_CONNECTION_STRING": STORAGE}, "or --platform-eventhub-connection-string or "
                                                                  "--platform-eventhub-namespace (the platform's)"),
    (["--platform-eventhub-namespace", "ns.servicebus.windows.net"], BASE,
     "--platform-eventhub-name is required with --platform-eventhub-namespace"),
    (["--platform-eventhub-connection-string", HUB.replace(";EntityPath=hub", "")], BASE,
     "--platform-eventhub-name is required: the platform's connection string has no EntityPath"),
    (["--platform-eventhub-connection-string", PLATFORM, "--platform-eventhub-namespace", "ns.servicebus.windows.net"],
     BASE, "--platform-eventhub-connection-string and --platform-eventhub-namespace exclude each other"),
    (["--platform-eventhub-name", "grid"], BASE,
     "--platform-eventhub-name needs --platform-eventhub-connection-string"),
    (["--platform-consumer-group", "fleet"], BASE, "--platform-consumer-group needs"),
    (["--platform-retention", "-1"], BASE, "--platform-retention:"),
    (["--reconcile-grace", "1e9"], BASE, "--reconcile-grace:"),
    (["--eventhub-client-id", "id-1"], BASE, "--eventhub-client-id needs --eventhub-namespace or "
                                             "--platform-eventhub-namespace"),
])
def test_a_wrong_platform_hub_setting_stops_start_up_with_one_line(argv: list[str], env: dict[str, str], message: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each mistake in the platform hub's settings is one line on stderr naming the flag, and exit code 2."""
    assert main(["fleet", *argv], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert "c2VjcmV0" not in err


def test_use_development_storage_builds_the_checkpoint_store_for_azurites_default_address() -> None:
    """``UseDevelopmentStorage=true``, which the settings accept, builds both storage clients (no traceback at
    start-up) on Azurite's blob service at 127.0.0.1:10000 and its development account."""
    from azure.storage.blob.aio import ContainerClient  # noqa: PLC0415 - the program's wiring

    from se_exporter.fleet.consumer import ObservedCheckpointStore  # noqa: PLC0415 - the program's wiring
    from se_exporter.fleet.main import on_container  # noqa: PLC0415 - the program's wiring

    s = settings(["--checkpoint-connection-string", "UseDevelopmentStorage=true"])

    async def build() -> None:  # in a running loop, as the program builds them: their sessions need one
        container = on_container(ContainerClient, s, lambda _client_id: None)
        store = on_container(ObservedCheckpointStore, s, lambda _client_id: None)
        try:
            assert container.url.startswith("http://127.0.0.1:10000/devstoreaccount1/")
            assert container.account_name == "devstoreaccount1"
        finally:
            for client in (container, store):
                await client.close()

    asyncio.run(build())


def test_each_hub_is_shown_as_the_namespace_and_hub_the_sdk_reads_without_its_key() -> None:
    """The start-up line names each hub as namespace/hub: a name given wins over EntityPath, as in the SDK."""
    s = settings(["--eventhub-name", "other", "--platform-eventhub-namespace", "grid.servicebus.windows.net",
                  "--platform-eventhub-name", "grid"])
    assert [hub.shown() for hub in s.hubs] == ["ns.servicebus.windows.net/other", "grid.servicebus.windows.net/grid"]
    assert settings([]).hubs[0].shown() == "ns.servicebus.windows.net/hub"


def test_every_bound_the_fleet_reports_says_why_in_its_log_line_and_is_in_the_docs() -> None:
    """Each bound's log line explains it (no empty text after the colon), and docs/fleet.md's table lists it."""
    from se_exporter.fleet.message import BOUND_NAMES  # noqa: PLC0415 - the names, only for this check
    from se_exporter.fleet.platform.coverage import COVERAGE_BOUND_NAMES  # noqa: PLC0415
    from se_exporter.fleet.platform.reader import PLATFORM_BOUND_NAMES  # noqa: PLC0415
    from se_exporter.fleet.platform.records import PICTURE_BOUND_NAMES  # noqa: PLC0415
    from se_exporter.fleet.report import BOUND_HELP  # noqa: PLC0415

    readme = (Path(__file__).parents[2] / "docs" / "fleet.md").read_text()
    for bound in (*BOUND_NAMES, *PLATFORM_BOUND_NAMES, *PICTURE_BOUND_NAMES, *COVERAGE_BOUND_NAMES):
        assert BOUND_HELP.get(bound), bound
        assert f"| `{bound}` |" in readme, bound


def test_the_platform_flags_naming_the_sidecars_hub_stop_start_up() -> None:
    """The sidecars' hub given again as the platform's (by connection string or namespace, any consumer group)
    would be read twice by one process, its two receivers taking each partition from each other: refused, naming
    the hub and not the key; the same hub name in another namespace (or on another port) is another hub."""
    for argv in (["--platform-eventhub-connection-string", HUB],
                 ["--platform-eventhub-namespace", "NS.servicebus.windows.net", "--platform-eventhub-name", "HUB",
                  "--platform-consumer-group", "fleet"]):
        with pytest.raises(ConfigError) as caught:
            settings(argv)
        assert "names the sidecars' hub ns.servicebus.windows.net/hub" in str(caught.value)
        assert "c2VjcmV0" not in str(caught.value) and "\n" not in str(caught.value)
    elsewhere = HUB.replace("sb://ns.servicebus.windows.net/", "sb://ns.servicebus.windows.net:5672/")
    assert len(settings(["--platform-eventhub-connection-string", elsewhere]).hubs) == 2
    assert len(settings(["--platform-eventhub-namespace", "other.servicebus.windows.net",
                         "--platform-eventhub-name", "hub"]).hubs) == 2


def test_a_hub_that_cannot_say_its_partitions_at_start_is_asked_again_until_it_answers() -> None:
    """Asked once, a hub unreachable at start kept hub_partitions (and the unread-partitions alert of every hub)
    absent for good: it is asked again, backing off, until it answers, and a stop ends the asking."""
    import asyncio  # noqa: PLC0415 - this test's own loop
    from types import SimpleNamespace  # noqa: PLC0415

    from se_exporter.fleet.main import _count_partitions  # noqa: PLC0415 - the program's wiring

    class Hub:
        eventhub_name = "grid"

        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, 0

        async def get_partition_ids(self) -> list[str]:
            self.calls += 1
            if self.calls <= self.failures:
                raise ConnectionError("refused")
            return ["0", "1", "2"]

    async def scenario() -> None:
        hub, service, stop = Hub(failures=3), SimpleNamespace(hub_partitions=None), asyncio.Event()
        await asyncio.wait_for(_count_partitions(hub, service, stop, first=0.001), 10)  # type: ignore[arg-type]
        assert (service.hub_partitions, hub.calls) == (3, 4)
        never, stopped = Hub(failures=10**9), SimpleNamespace(hub_partitions=None)
        stop.set()
        await asyncio.wait_for(_count_partitions(never, stopped, stop, first=0.001), 10)  # type: ignore[arg-type]
        assert stopped.hub_partitions is None and never.calls == 0

    asyncio.run(scenario())
