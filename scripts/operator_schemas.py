"""Write the Prometheus Operator's CRD schemas the deploy tests check against (``make operator-schemas``).

    uv run --isolated --no-project --with cloudcoil.models.prometheus_operator==VERSION \
        python scripts/operator_schemas.py

cloudcoil.models.prometheus_operator (Apache-2.0, as the operator) carries the operator's CRDs as generated models;
its version is the operator's. Each kind's schema is written as JSON Schema to tests/schemas/prometheus-operator/,
with every object that lists its properties closed to any other (a structural CRD schema prunes unknown fields, and
the API server's strict field validation rejects them), beside the package's licence and version. The files are
checked in: the suite needs neither the package nor the network, and a new operator version is a reviewed diff.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
DEST = ROOT / "tests" / "schemas" / "prometheus-operator"
PACKAGE = "cloudcoil.models.prometheus_operator"
KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to any other (maps keep theirs open)."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            closed(value)
    elif isinstance(schema, list):
        for value in schema:
            closed(value)
    return schema


def main() -> int:
    import cloudcoil.models.prometheus_operator.v1 as operator  # noqa: PLC0415 - only in uv's throwaway env

    version = metadata.version(PACKAGE)
    DEST.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        schema = closed(getattr(operator, kind).model_json_schema(by_alias=True, mode="validation"))
        schema["$comment"] = f"{kind} (monitoring.coreos.com/v1) from {PACKAGE} {version}, closed to unknown fields"
        (DEST / f"{kind}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    licence = next(f for f in metadata.files(PACKAGE) or [] if f.name == "LICENSE")
    (DEST / "LICENSE").write_text(Path(str(licence.locate())).read_text())
    (DEST / "VERSION").write_text(f"{PACKAGE}=={version}\n")
    print(f"{', '.join(KINDS)} from {PACKAGE} {version} in {DEST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
