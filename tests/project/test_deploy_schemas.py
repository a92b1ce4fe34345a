"""What the real helm renders from charts/se-exporter, against the real schemas, strictly: every object of every
tested value set (charts/se-exporter/ci) on every Kubernetes version AKS supports (kubernetes-validate's OpenAPI
schemas), the Prometheus Operator's objects against its CRD schemas. A misspelt field in each template fails the
check, so the check is known to bite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import Reliability
from tests.support.kube_schemas import (
    CHART,
    KUBERNETES_VERSIONS,
    OPERATOR_KINDS,
    ROOT,
    VALUE_SETS,
    errors,
    render,
)

# A misspelt field in each template that renders Kubernetes objects (old text -> broken text), and the value set
# that renders it: the mistakes `kubectl apply` would reject or silently drop.
BROKEN = {
    "daemonset.yaml": ("terminationGracePeriodSeconds:", "terminationGracePeriodSecond:", "default"),
    "daemonset-windows.yaml": ("startupProbe:", "startupProbes:", "windows"),
    "service.yaml": ("clusterIP: None", "clusterIp: None", "default"),
    "serviceaccount.yaml": ("automountServiceAccountToken:", "automountServiceAcountToken:", "default"),
    "priorityclass.yaml": ("preemptionPolicy:", "preemptPolicy:", "default"),
    "servicemonitor.yaml": ("  namespaceSelector:", "  namespaceSelecter:", "default"),
    "podmonitor.yaml": ("  podMetricsEndpoints:", "  podMetricEndpoints:", "pod-monitor"),
    "_helpers.tpl": ("  relabelings:", "  relabellings:", "default"),
    "prometheusrule.yaml": ("  groups:", "  group:", "default"),
    "networkpolicy.yaml": ("policyTypes:", "policyType:", "default"),
    "dashboards.yaml": ("data:", "datas:", "pod-monitor"),
    "fleet/deployment.yaml": ("  replicas:", "  replica:", "fleet"),
    "fleet/service.yaml": ("targetPort: metrics", "targetport: metrics", "fleet"),
    "fleet/serviceaccount.yaml": ("automountServiceAccountToken:", "automountServiceAccountTokens:", "fleet"),
    "fleet/poddisruptionbudget.yaml": ("maxUnavailable:", "maxUnavailabe:", "fleet"),
}


def _name(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


VALUES = {_name(p): p for p in VALUE_SETS}


@pytest.mark.parametrize("values", VALUE_SETS, ids=_name)
def test_every_rendered_object_is_valid_strictly(values: Path) -> None:
    """Each object helm renders for the value set is valid against its schema, unknown fields included, on every
    version."""
    rendered = render(values)
    assert rendered
    for version in KUBERNETES_VERSIONS:
        for document in rendered:
            assert errors(document, version) == [], f"{document['kind']} {document['metadata']['name']} on {version}"


def test_the_value_sets_cover_every_template_and_operator_kind() -> None:
    """Some tested value set renders each template of the chart, and the ServiceMonitor, PodMonitor and
    PrometheusRule are each checked against the CRD schemas (none skipped as an unknown kind)."""
    templates = {str(p.relative_to(CHART / "templates")) for p in (CHART / "templates").rglob("*.yaml")}
    assert templates | {"_helpers.tpl"} == set(BROKEN)
    kinds = {d["kind"] for values in VALUE_SETS for d in render(values)}
    assert kinds >= OPERATOR_KINDS
    vendored = ROOT / "tests" / "schemas" / "prometheus-operator"
    assert (vendored / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert (vendored / "VERSION").read_text().startswith("cloudcoil.models.prometheus_operator==")


@pytest.mark.parametrize("template", list(BROKEN))
def test_a_misspelt_field_in_a_template_fails_the_check(template: str, tmp_path: Path,
                                                        reliability: Reliability) -> None:
    """With one template of a copy of the chart broken, some object it renders fails the strict schema check."""
    chart = tmp_path / "se-exporter"
    shutil.copytree(CHART, chart)
    target = chart / "templates" / template
    old, new, values = BROKEN[template]
    text = target.read_text()
    assert old in text
    target.write_text(text.replace(old, new))
    rendered = render(chart / "ci" / f"{values}-values.yaml", chart=chart)
    assert [e for d in rendered for e in errors(d, KUBERNETES_VERSIONS[-1])]
    reliability("Kubernetes", "a misspelt field in each template of the Helm chart (terminationGracePeriodSecond, "
                "relabellings, policyType...), rendered by the real helm",
                "each rejected by the strict schema check (Kubernetes 1.32-1.35 OpenAPI, Prometheus Operator CRDs)")
