"""Deployment files: the systemd unit verifies, manifests parse and match what the sidecar serves."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from se_exporter.infra.options import DEFAULT_PORT
from se_exporter.sidecar.settings import DEFAULT_IMDS_URL, RUN_OPTIONS

ROOT = Path(__file__).parent.parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ROOT / "deploy" / "kubernetes-overlays"


CLUSTER_SCOPED = {"PriorityClass"}
# The built-in classes (scheduling.k8s.io): user-defined PriorityClasses may go up to 1,000,000,000 only.
USER_PRIORITY_MAX, SYSTEM_CLUSTER_CRITICAL = 1_000_000_000, 2_000_000_000
# The taints AKS puts on nodes where maintenance matters most (Microsoft's AKS documentation): Spot pools, dedicated
# system pools, the node auto-drain is about to drain (effect not documented: both), and the GPU pool example.
AKS_TAINTS = [
    {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},
    {"key": "remediator.kubernetes.azure.com/unschedulable", "effect": "NoSchedule"},
    {"key": "remediator.kubernetes.azure.com/unschedulable", "effect": "NoExecute"},
    {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
]


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Every document of deploy/kubernetes and its overlays by (kind, file name), kustomization files aside."""
    found = {}
    for path in sorted([*KUBE.glob("*.yaml"), *OVERLAYS.glob("*/*.yaml")]):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document["kind"] in CLUSTER_SCOPED:
                assert "namespace" not in document["metadata"], path.name
            else:
                assert document["metadata"]["namespace"] == "monitoring", path.name
            found[(document["kind"], path.name)] = document
    return found


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


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit without a single complaint (unknown keys only warn, so silence
    is required too); ExecStart points at this checkout's console script, as it would at /opt/se-exporter."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not found (Debian's systemd package)")
    script = Path(sys.executable).parent / "se-exporter"
    unit = (SYSTEMD / "se-exporter.service").read_text()
    assert "ExecStart=/opt/se-exporter/bin/se-exporter run" in unit
    (tmp_path / "se-exporter.service").write_text(unit.replace("/opt/se-exporter/bin/se-exporter", str(script)))
    result = subprocess.run([analyze, "verify", str(tmp_path / "se-exporter.service")], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_unit_is_hardened() -> None:
    """Unprivileged, state in StateDirectory, a read-only system, restart on failure."""
    unit = (SYSTEMD / "se-exporter.service").read_text()
    for line in ("DynamicUser=yes", "StateDirectory=se-exporter", "ProtectSystem=strict", "NoNewPrivileges=yes",
                 "Environment=SE_EXPORTER_STATE_DIR=/var/lib/se-exporter", "Restart=always", "CapabilityBoundingSet="):
        assert f"\n{line}\n" in unit, line


def test_cloud_init_carries_the_same_unit() -> None:
    """The scale-set custom data embeds exactly the unit file."""
    data = yaml.safe_load((SYSTEMD / "cloud-init.yaml").read_text())
    files = {item["path"]: item["content"] for item in data["write_files"]}
    assert files["/etc/systemd/system/se-exporter.service"] == (SYSTEMD / "se-exporter.service").read_text()


def test_vm_installs_are_offline_with_hashes_required() -> None:
    """install.sh and the scale-set custom data install se-exporter only from the wheelhouse's requirements.txt,
    with no package index and every hash required (tests/project/test_wheelhouses.py runs install.sh's command)."""
    data = yaml.safe_load((SYSTEMD / "cloud-init.yaml").read_text())
    script = (SYSTEMD / "install.sh").read_text().replace("\\\n", " ")
    steps = [c for c in data["runcmd"] if "pip install" in c]
    steps += [line for line in script.splitlines() if "pip install" in line]
    assert len(steps) == 2
    for step in steps:
        assert {"--no-index", "--require-hashes", "-r"} <= set(step.split()), step


def test_environment_example_names_only_real_settings() -> None:
    """Every variable in the env file example is one se-exporter (or OpenTelemetry) reads."""
    known = {option.env for option in RUN_OPTIONS}
    text = (SYSTEMD / "se-exporter.env.example").read_text() + (SYSTEMD / "cloud-init.yaml").read_text()
    names = set(re.findall(r"^\s*#?\s*((?:SE_EXPORTER|OTEL)_[A-Z_]+)=", text, re.M))
    assert names and names <= known | {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def test_daemonset_matches_the_sidecar() -> None:
    """Port, probe paths and state directory are the ones the sidecar serves and uses; the pod runs locked down."""
    daemonset = manifests()[("DaemonSet", "daemonset.yaml")]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": DEFAULT_PORT, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["SE_EXPORTER_LISTEN"] == f":{DEFAULT_PORT}"
    assert {m["mountPath"] for m in container["volumeMounts"]} == {env["SE_EXPORTER_STATE_DIR"]}
    security = container["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                        "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] >= 1000
    assert container["resources"]["limits"]["memory"] and container["resources"]["requests"]["cpu"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_scraping_objects_point_at_the_metrics_port() -> None:
    """Service, ServiceMonitor and PodMonitor select the pods and scrape /metrics on the metrics port."""
    found = manifests()
    labels = found[("DaemonSet", "daemonset.yaml")]["spec"]["template"]["metadata"]["labels"]
    service = found[("Service", "daemonset.yaml")]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == DEFAULT_PORT and service["spec"]["ports"][0]["name"] == "metrics"
    service_monitor = found[("ServiceMonitor", "monitoring.yaml")]
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert service_monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    pod_monitor = found[("PodMonitor", "monitoring.yaml")]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_scraping_objects_label_series_with_the_node() -> None:
    """Both monitors copy the pod's node name into `node`, the label kube-state-metrics names nodes by: the join of
    the VM dashboard's node-conditions panel and of the SeExporterAksEventNotSeen rule."""
    found = manifests()
    for endpoint in (found[("ServiceMonitor", "monitoring.yaml")]["spec"]["endpoints"][0],
                     found[("PodMonitor", "monitoring.yaml")]["spec"]["podMetricsEndpoints"][0]):
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]


def test_daemonset_runs_on_every_linux_node_whatever_its_taints() -> None:
    """Selected by OS alone (a Windows node cannot start the Linux image), and tolerating every taint AKS uses for
    Spot, system and GPU pools and for node auto-drain, so no Linux node goes unwatched."""
    pod = manifests()[("DaemonSet", "daemonset.yaml")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert "affinity" not in pod  # nothing narrows the selection further
    for taint in AKS_TAINTS:
        assert tolerates(pod["tolerations"], taint), taint
    assert not tolerates([{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}],
                         AKS_TAINTS[0])  # the checker itself tells tolerations apart


def test_daemonset_priority_preempts_workloads_but_never_system_pods() -> None:
    """The pod's PriorityClass ships beside it, is the highest a user class can be (so a full node makes room for
    it) and stays below system-cluster-critical (so it never preempts CoreDNS); it is nobody else's default."""
    found = manifests()
    pod = found[("DaemonSet", "daemonset.yaml")]["spec"]["template"]["spec"]
    priority = found[("PriorityClass", "daemonset.yaml")]
    assert pod["priorityClassName"] == priority["metadata"]["name"]
    assert priority["value"] == USER_PRIORITY_MAX < SYSTEM_CLUSTER_CRITICAL
    assert priority["globalDefault"] is False and priority["preemptionPolicy"] == "PreemptLowerPriority"


def test_prometheus_rule_is_the_alert_rules_file() -> None:
    """The PrometheusRule carries exactly the groups of dashboards/alerts.yaml and the recording rules."""
    rule = manifests()[("PrometheusRule", "prometheusrule.yaml")]
    groups = [yaml.safe_load((ROOT / "dashboards" / name).read_text())["groups"] for name in ("alerts.yaml",
                                                                                             "rules.yaml")]
    assert rule["spec"] == {"groups": groups[0] + groups[1]}


def test_network_policy_allows_imds_and_event_hubs_only() -> None:
    """Egress: IMDS (its /32, port 80), DNS, and AMQP/HTTPS; nothing else."""
    policy = manifests()[("NetworkPolicy", "networkpolicy.yaml")]
    egress = policy["spec"]["egress"]
    imds_cidr = f"{urlsplit(DEFAULT_IMDS_URL).hostname}/32"  # the documented IMDS address, never contacted here
    imds = [rule for rule in egress if rule.get("to") == [{"ipBlock": {"cidr": imds_cidr}}]]
    assert imds and imds[0]["ports"] == [{"port": 80, "protocol": "TCP"}]
    ports = {port["port"] for rule in egress for port in rule["ports"]}
    assert ports == {80, 53, 5671, 443}
    assert policy["spec"]["ingress"] == [{"ports": [{"port": DEFAULT_PORT, "protocol": "TCP"}]}]


def test_eventhubs_examples() -> None:
    """The Secret feeds the variable the DaemonSet reads; the workload-identity example names what it needs."""
    found = manifests()
    secret = found[("Secret", "secret.yaml")]
    container = found[("DaemonSet", "daemonset.yaml")]["spec"]["template"]["spec"]["containers"][0]
    reference = next(e for e in container["env"] if e["name"] == "SE_EXPORTER_EVENTHUB_CONNECTION_STRING")
    assert reference["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert reference["valueFrom"]["secretKeyRef"]["key"] in secret["stringData"]
    account = found[("ServiceAccount", "workload-identity.yaml")]  # the overlay's patches
    assert "azure.workload.identity/client-id" in account["metadata"]["annotations"]
    patch = found[("DaemonSet", "workload-identity.yaml")]
    assert patch["spec"]["template"]["metadata"]["labels"] == {"azure.workload.identity/use": "true"}
