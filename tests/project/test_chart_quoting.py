"""Chart values a hostile or careless user gives, rendered by the real helm: every value reaches its manifest quoted
for where it lands (YAML, the Windows pods' PowerShell command line), the schema refuses names, sizes, addresses
and ids that are not what they claim, a node directory of the system is refused for the state, and the fleet reads
with a consumer group of its own."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kube_schemas import CHART, VALUE_SETS, HelmFailed, render, run_helm

VALUES = {p.name.removesuffix("-values.yaml"): p for p in VALUE_SETS}
# PowerShell ends a single-quoted string at any of these (its tokenizer's IsSingleQuote): ASCII ' and the four
# typographic single quotes; inside one, two in a row stand for one.
PS_QUOTES = "'\u2018\u2019\u201a\u201b"
# The issue's payload: a quote PowerShell honours, then a command of the attacker's, run as SYSTEM.
PWNED = "x\u2019); New-Item -Path C:\\pwned -ItemType File #"
# A value that, unquoted anywhere in a manifest, would add a key (at any indentation) or a document.
INJECTED = "x\"'\n---\ninjected: 1\n" + "".join(" " * n + "injected: 1\n" for n in range(2, 16, 2)) + "#"


def load(values: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(values.read_text())
    return loaded


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, maps merged key by key as helm merges values files."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def render_values(tmp_path: Path, values: dict[str, Any], *, schema: bool = True) -> list[dict[str, Any]]:
    """What helm renders for ``values``; schema=False skips the values schema, to test the templates' own quoting."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    args = ["template", "se-exporter", "--namespace", "monitoring", "--values", str(path)]
    text = run_helm(args + ([] if schema else ["--skip-schema-validation"]))
    return [d for d in yaml.safe_load_all(text) if d is not None]


def ps_read(line: str) -> tuple[str, list[str]]:
    """A PowerShell line split as PowerShell's tokenizer reads single-quoted strings: the skeleton (each literal
    left as '') and the literals' values. Any of PS_QUOTES opens and closes a literal; two in a row inside one stand
    for the second; a # outside a literal starts a comment, to the end of the line."""
    skeleton, literals, i = [], [], 0
    while i < len(line):
        if line[i] == "#":
            skeleton.append(line[i:])
            break
        if line[i] not in PS_QUOTES:
            skeleton.append(line[i])
            i += 1
            continue
        i, value = i + 1, []
        while True:
            if i >= len(line):
                raise AssertionError(f"unterminated literal in {line!r}")
            if line[i] in PS_QUOTES:
                if i + 1 < len(line) and line[i + 1] in PS_QUOTES:
                    value.append(line[i + 1])
                    i += 2
                    continue
                i += 1
                break
            value.append(line[i])
            i += 1
        literals.append("".join(value))
        skeleton.append("''")
    return "".join(skeleton), literals


def install_parameters(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """install.ps1's parameters on the Windows pods' command line, each a literal (or a list of them), read as
    PowerShell reads them; AssertionError if anything but parameters and literals stands on that line."""
    (pod,) = [d for d in documents if d["metadata"]["name"] == "se-exporter-windows"]
    script = pod["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    (line,) = [ln for ln in script.splitlines() if "install.ps1" in ln]
    skeleton, literals = ps_read(line)
    prefix = "& (Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT '')"
    assert skeleton.startswith(prefix) and literals.pop(0) == "install.ps1", skeleton
    found: dict[str, Any] = {}
    for flag, argument in re.findall(r" -(\w+) (\S+)", skeleton[len(prefix):]):
        if argument == "''":
            found[flag] = literals.pop(0)
        elif re.fullmatch(r"@\(''(,'')*\)", argument):
            found[flag] = [literals.pop(0) for _ in range(argument.count("''"))]
        else:
            assert argument.isdigit(), argument
            found[flag] = int(argument)
    rebuilt = "".join(f" -{f} {a}" for f, a in re.findall(r" -(\w+) (\S+)", skeleton[len(prefix):]))
    assert skeleton == prefix + rebuilt and not literals, skeleton  # nothing outside a parameter or a literal
    return found


def test_the_ps_reader_sees_the_issues_injection() -> None:
    """The reader used below reads a typographic quote as PowerShell does: the issue's payload, with only the ASCII
    quote doubled (what the chart did), ends its literal and leaves New-Item outside it."""
    skeleton, _ = ps_read("& x -ScrapeFrom @('" + PWNED.replace("'", "''") + "')")
    assert "New-Item -Path C:\\pwned" in skeleton


def test_every_windows_value_reaches_install_ps1_as_one_literal(tmp_path: Path) -> None:
    """Every value the Windows pods' PowerShell line is built from arrives as one single-quoted literal holding
    exactly the value, whichever of PowerShell's five single quotes it contains; even past the schema (which refuses
    these values), nothing of them runs as a command."""
    payloads = {q: f"{q}); New-Item -Path C:\\pwned-{ord(q):x} -ItemType File #{q}" for q in PS_QUOTES}
    hostile = {
        "eventhubs": {"namespace": payloads["'"], "name": payloads["\u2018"]},
        "windows": {"scrapeFrom": [PWNED, *payloads.values()], "managedIdentityClientId": payloads["\u2019"],
                    "otlpEndpoint": "http://10.224.0.50:4318/" + payloads["\u201a"],
                    "wheelhouseSha256": payloads["\u201b"]},
    }
    documents = render_values(tmp_path, merged(load(VALUES["windows"]), hostile), schema=False)
    assert install_parameters(documents) == {
        "Sha256": payloads["\u201b"], "Port": 10169, "ScrapeFrom": [PWNED, *payloads.values()],
        "ClientId": payloads["\u2019"], "EventHubName": payloads["\u2018"], "EventHubNamespace": payloads["'"],
        "OtlpEndpoint": "http://10.224.0.50:4318/" + payloads["\u201a"]}


@pytest.mark.parametrize(("key", "value"), [
    ("windows.scrapeFrom", [PWNED]),
    ("windows.scrapeFrom", ["10.224.0.0/16 ; whoami"]),
    ("windows.managedIdentityClientId", PWNED),
    ("windows.managedIdentityClientId", "33333333-3333-3333-3333-33333333333g"),
    ("windows.otlpEndpoint", "http://10.224.0.50:4318/" + PWNED),
    ("otlp.endpoint", "http://collector:4318/v1/traces'"),
    ("eventhubs.name", "scheduled-events\u2019"),
    ("serviceAccount.workloadIdentity.clientId", "------------------------------------"),
], ids=["scrape-from-pwned", "scrape-from-command", "client-id-pwned", "client-id-not-hex", "otlp-windows-quote",
        "otlp-quote", "hub-name-quote", "workload-client-id-dashes"])
def test_the_schema_refuses_what_is_not_an_address_or_a_guid(tmp_path: Path, key: str, value: Any) -> None:
    """windows.scrapeFrom takes addresses, subnets, ranges and Windows Firewall's keywords only, client ids are
    GUIDs, endpoints URLs and the hub a name: the issue's payload stops `helm template` with one line naming the
    value."""
    extra: dict[str, Any] = value
    for part in reversed(key.split(".")):
        extra = {part: extra}
    with pytest.raises(HelmFailed, match="values don't meet the specifications of the schema") as refused:
        render_values(tmp_path, merged(load(VALUES["windows"]), extra))
    (line,) = [ln for ln in str(refused.value).splitlines() if ln.startswith("- at ")]
    assert f"/{key.replace('.', '/')}" in line


@pytest.mark.parametrize("scrape_from", [["10.224.0.0/16"], ["LocalSubnet", "10.0.0.1", "10.0.0.1-10.0.0.9"],
                                         ["Any"], ["fd00::/8", "2001:db8::1"], ["10.0.0.0/255.255.0.0"],
                                         ["Internet", "DefaultGateway", "Intranet"]])
def test_windows_firewall_addresses_pass(tmp_path: Path, scrape_from: list[str]) -> None:
    """What New-NetFirewallRule -RemoteAddress takes (addresses, subnets by prefix or mask, ranges, its keywords)
    passes the schema and reaches install.ps1 unchanged."""
    documents = render_values(tmp_path, merged(load(VALUES["windows"]), {"windows": {"scrapeFrom": scrape_from}}))
    assert install_parameters(documents)["ScrapeFrom"] == scrape_from


def scalar_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every scalar of values.yaml (a list's first item for lists of scalars, a key of its own for
    empty maps and lists)."""
    if isinstance(values, dict):
        if not values and prefix:
            return [(*prefix, "k")]
        return [p for key, value in values.items() for p in scalar_paths(value, (*prefix, key))]
    if isinstance(values, list):
        return [(*prefix, "0")]
    return [prefix]


def with_scalar(values: dict[str, Any], path: tuple[str, ...], payload: str) -> dict[str, Any]:
    """``values`` with the scalar at ``path`` (scalar_paths') set to ``payload``; a list becomes [payload]."""
    out = copy.deepcopy(values)
    node = out
    for key in path[:-2]:
        node = node.setdefault(key, {})
    if path[-1] == "0":
        node[path[-2]] = [payload]
    elif len(path) == 1:
        node[path[0]] = payload
    else:
        parent = node.get(path[-2])
        node[path[-2]] = {**(parent if isinstance(parent, dict) else {}), path[-1]: payload}
    return out


# Everything on at once: the node pods with a host path, Windows, the fleet (with its platform stream), dashboards.
EVERYTHING = merged(merged(load(VALUES["fleet"]), load(VALUES["windows"])),
                    {"dashboards": {"enabled": True}, "state": {"hostPath": "/var/lib/se-exporter"}})
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def injected(documents: list[dict[str, Any]]) -> list[str]:
    """Where a mapping key `injected` appears in the rendered objects."""
    found = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "injected":
                    found.append(where)
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{where}/{index}")

    for document in documents:
        walk(document, f"{document.get('kind')}")
    return found


@pytest.mark.parametrize("path", scalar_paths(DEFAULTS), ids=".".join)
def test_no_value_can_add_a_field_to_a_manifest(tmp_path: Path, path: tuple[str, ...]) -> None:
    """Each value of values.yaml in turn set to text that, unquoted, would add a key at any indentation or a
    document (the schema skipped, so the templates' own quoting is what is tested): every object still parses and is
    an object, and none has an injected key. A value the templates cannot use instead stops the render (helm's
    error, never a YAML parse error)."""
    values = with_scalar(EVERYTHING, path, INJECTED)
    try:
        documents = render_values(tmp_path, values, schema=False)
    except HelmFailed as refused:
        assert "YAML parse error" not in str(refused), str(refused)
        return
    assert injected(documents) == []
    assert all({"apiVersion", "kind", "metadata"} <= d.keys() for d in documents)


@pytest.mark.parametrize("key", ["priorityClassName", "fleet.priorityClassName"])
def test_a_priority_class_name_cannot_give_the_pods_the_hosts_namespaces(tmp_path: Path, key: str) -> None:
    """The issue's payload for priorityClassName and fleet.priorityClassName is refused by the schema (a DNS-1123
    name), and past the schema renders as a quoted name: no pod gets hostPID or hostIPC."""
    payload = "x\n      hostPID: true\n      hostIPC: true"
    extra: dict[str, Any] = {"priorityClassName": payload}
    if key.startswith("fleet."):
        extra = {"fleet": extra}
    with pytest.raises(HelmFailed, match=r"- at '/(fleet/)?priorityClassName': .*does not match pattern"):
        render_values(tmp_path, merged(load(VALUES["fleet"]), extra))
    documents = render_values(tmp_path, merged(load(VALUES["fleet"]), extra), schema=False)
    for document in documents:
        pod = document.get("spec", {}).get("template", {}).get("spec", {})
        assert "hostPID" not in pod and "hostIPC" not in pod, document["kind"]
    names = {d["metadata"]["name"]: d["spec"]["template"]["spec"].get("priorityClassName") for d in documents
             if d["kind"] in ("DaemonSet", "Deployment")}
    assert payload in names.values()


@pytest.mark.parametrize(("key", "value"), [
    ("nameOverride", "Se_Exporter"), ("fullnameOverride", "se-exporter."), ("namespaceOverride", "Monitoring"),
    ("priorityClassName", "-critical"), ("serviceAccount.name", "a b"), ("fleet.serviceAccount.name", "x\ny"),
    ("eventhubs.existingSecret.name", "secret/../x"), ("fleet.checkpoint.existingSecret.name", "UPPER"),
    ("dashboards.namespace", "grafana ns"), ("state.sizeLimit", "128Mi\n          medium: Memory"),
    ("state.sizeLimit", "lots"), ("fullnameOverride", "x" * 64),
])
def test_names_and_sizes_are_refused_unless_kubernetes_would_take_them(tmp_path: Path, key: str, value: str) -> None:
    """Object, namespace, class, account and Secret names follow DNS-1123 and state.sizeLimit is a quantity:
    anything else stops `helm template` with one line naming the value."""
    extra: dict[str, Any] = value  # type: ignore[assignment]
    for part in reversed(key.split(".")):
        extra = {part: extra}
    with pytest.raises(HelmFailed, match="values don't meet the specifications of the schema") as refused:
        render_values(tmp_path, merged(load(VALUES["default"]), extra))
    (line,) = [ln for ln in str(refused.value).splitlines() if ln.startswith("- at ")]
    assert f"/{key.replace('.', '/')}'" in line


@pytest.mark.parametrize("size", ["128Mi", "1Gi", "500M", "1.5Gi", 134217728])
def test_quantities_pass_and_reach_the_pod_quoted(tmp_path: Path, size: object) -> None:
    """A Kubernetes quantity (or a number of bytes) is taken and reaches the emptyDir as the quantity it is."""
    documents = render_values(tmp_path, merged(load(VALUES["default"]), {"state": {"sizeLimit": size}}))
    (daemonset,) = [d for d in documents if d["kind"] == "DaemonSet"]
    assert str(daemonset["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"]) == str(size)


SYSTEM_PATHS = ["/", "/etc", "/usr", "/var", "/var/lib", "/var/lib/kubelet", "/root", "/home", "/boot", "/opt",
                "/etc/kubernetes", "/var/lib/containerd", "/var/log", "/usr/local/bin", "/run", "/dev", "/proc",
                "/sys", "/var/lib/se-exporter/../kubelet", "/var/lib/kubelet/se-exporter", "/etc/",
                "/tmp"]  # noqa: S108 - a node path the chart must refuse; nothing here writes to it


@pytest.mark.parametrize("path", SYSTEM_PATHS)
def test_a_system_directory_is_refused_for_the_state(path: str) -> None:
    """state.hostPath on a directory of the node's own (which the init container would hand to uid 10001) stops
    `helm template` with one line naming it and the directory to use instead."""
    with pytest.raises(HelmFailed) as refused:
        render(VALUES["default"], f"state.hostPath={path}")
    (line,) = [ln for ln in str(refused.value).splitlines() if "execution error" in ln]
    assert f"state.hostPath={path} " in line and "use /var/lib/se-exporter" in line


@pytest.mark.parametrize(("path", "mounted"), [("/var/lib/se-exporter", "/var/lib/se-exporter"),
                                               ("/var/lib/se-exporter/prod/", "/var/lib/se-exporter/prod"),
                                               ("/mnt/se-exporter-state", "/mnt/se-exporter-state")])
def test_a_directory_of_its_own_is_taken_for_the_state(path: str, mounted: str) -> None:
    """A directory named for se-exporter outside the node's system and runtime trees is mounted (cleaned)."""
    (daemonset,) = [d for d in render(VALUES["default"], f"state.hostPath={path}") if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == mounted


def test_the_fleet_reads_with_a_consumer_group_of_its_own() -> None:
    """By default the fleet reads both hubs with its own consumer group, not $Default (which `consume` and other
    tools read with: two readers of one group take each other's partitions)."""
    (deployment,) = [d for d in render(VALUES["fleet"]) if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SE_EXPORTER_CONSUMER_GROUP"] == env["SE_EXPORTER_PLATFORM_CONSUMER_GROUP"] == "se-exporter-fleet"
