"""deploy/kubernetes and its overlays against the real schemas, strictly: every object on every Kubernetes version AKS
supports (kubernetes-validate's OpenAPI schemas), the Prometheus Operator's objects against its CRD schemas, and what
the real `kubectl kustomize` builds from the base and each overlay. A broken copy of every file (a misspelt field)
fails each check, so the checks are known to bite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import Reliability
from tests.kube_schemas import (
    BASE,
    KUBERNETES_VERSIONS,
    OPERATOR_KINDS,
    OVERLAYS,
    ROOT,
    documents,
    errors,
    kustomizations,
    kustomize,
    object_files,
)

# A misspelt field in each file (old text -> broken text): the mistakes `kubectl apply` would reject or drop.
BROKEN = {
    BASE / "daemonset.yaml": ("terminationGracePeriodSeconds: 15",
                              "terminationGracePeriodSeconds: 15\n      hostNetwrok: true"),
    BASE / "monitoring.yaml": ("      relabelings:", "      relabellings:"),
    BASE / "prometheusrule.yaml": ("      annotations:", "      anotations:"),
    BASE / "networkpolicy.yaml": ("policyTypes:", "policyType:"),
    OVERLAYS / "eventhubs-key" / "secret.yaml": ("stringData:", "stringdata:"),
    OVERLAYS / "workload-identity" / "workload-identity.yaml": ("automountServiceAccountToken: true",
                                                                "automountServiceAcountToken: true"),
    BASE / "kustomization.yaml": ("resources:", "resource:"),
    OVERLAYS / "eventhubs-key" / "kustomization.yaml": ("resources:", "resources:\n  - missing.yaml"),
    OVERLAYS / "workload-identity" / "kustomization.yaml": ("patches:", "patchs:"),
}
OBJECT_FILES = object_files()


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT / "deploy"))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", OBJECT_FILES, ids=_id)
def test_every_object_is_valid_strictly(path: Path, version: str) -> None:
    """Each object of each file is valid against its schema, unknown fields included, on every version."""
    for document in documents(path):
        assert errors(document, version) == [], f"{document['kind']} in {_id(path)}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", OBJECT_FILES, ids=_id)
def test_a_misspelt_field_fails_the_schema_check(path: Path, version: str, tmp_path: Path) -> None:
    """The broken copy of each file has at least one object the check rejects."""
    old, new = BROKEN[path]
    text = path.read_text()
    assert old in text
    broken = tmp_path / path.name
    broken.write_text(text.replace(old, new, 1))
    assert any(errors(document, version) for document in documents(broken))


def test_every_file_has_a_broken_copy() -> None:
    """No object file and no kustomization escapes the can-it-fail test."""
    kustomization_files = [d / "kustomization.yaml" for d in kustomizations()]
    patches = [OVERLAYS / "workload-identity" / "workload-identity.yaml"]
    assert set(BROKEN) == {*OBJECT_FILES, *kustomization_files, *patches}


def test_operator_objects_are_checked_against_the_crd_schemas() -> None:
    """The ServiceMonitor, PodMonitor and PrometheusRule are each checked (none is skipped as an unknown kind)."""
    kinds = {d["kind"] for path in OBJECT_FILES for d in documents(path)}
    assert kinds >= OPERATOR_KINDS
    vendored = ROOT / "tests" / "schemas" / "prometheus-operator"
    assert (vendored / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert (vendored / "VERSION").read_text().startswith("cloudcoil.models.prometheus_operator==")


@pytest.mark.parametrize("directory", list(kustomizations()), ids=_id)
def test_kustomize_builds_valid_objects(directory: Path) -> None:
    """`kubectl kustomize` builds the base and each overlay, and what it builds is valid on every version."""
    built = kustomize(directory)
    assert {d["kind"] for d in built} >= {"DaemonSet", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"}
    for version in KUBERNETES_VERSIONS:
        for document in built:
            assert errors(document, version) == [], f"{document['kind']} from {_id(directory)} on {version}"


def test_overlays_add_what_they_are_named_for() -> None:
    """Event Hubs with a key adds the Secret the DaemonSet reads; workload identity annotates the ServiceAccount and
    labels the pods for the webhook, with the hub named; the base sends no PodMonitor (it would scrape twice)."""
    base = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(BASE)}
    assert ("PodMonitor", "se-exporter") not in base and ("Secret", "se-exporter-eventhubs") not in base
    keyed = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(OVERLAYS / "eventhubs-key")}
    assert keyed.keys() - base.keys() == {("Secret", "se-exporter-eventhubs")}
    identity = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(OVERLAYS / "workload-identity")}
    assert identity.keys() == base.keys()
    account = identity[("ServiceAccount", "se-exporter")]
    assert "azure.workload.identity/client-id" in account["metadata"]["annotations"]
    pod = identity[("DaemonSet", "se-exporter")]["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {"SE_EXPORTER_EVENTHUB_NAMESPACE", "SE_EXPORTER_EVENTHUB_NAME", "SE_EXPORTER_LISTEN"} <= env


@pytest.mark.parametrize("broken", list(BROKEN), ids=_id)
def test_a_broken_file_fails_the_kustomize_check(broken: Path, tmp_path: Path, reliability: Reliability) -> None:
    """With one file of a copy of deploy/ broken, building and checking some kustomization fails: kustomize rejects
    the file, or an object it builds fails the schema check."""
    copy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", copy)
    target = copy / broken.relative_to(ROOT / "deploy")
    old, new = BROKEN[broken]
    target.write_text(target.read_text().replace(old, new, 1))
    failures = []
    for directory in kustomizations(tmp_path):
        try:
            built = kustomize(directory)
        except RuntimeError as failed:
            failures.append(str(failed))
            continue
        failures += [e for d in built for e in errors(d, KUBERNETES_VERSIONS[-1])]
    assert failures
    reliability("Kubernetes", "a misspelt field in each file of deploy/kubernetes and its overlays (hostNetwrok, "
                "relabellings, patchs...), built with kubectl kustomize",
                "each rejected by kustomize or by the strict schema check (Kubernetes 1.32-1.35 OpenAPI, Prometheus "
                "Operator CRDs)")
