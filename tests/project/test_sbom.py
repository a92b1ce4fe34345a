"""The wheelhouses' CycloneDX SBOMs (`make sbom`, which make test runs first) list exactly the locked runtime packages
and se-exporter, at the locked versions, with the lock's hashes and the sha256 of every wheel shipped."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scripts import lockfile, sbom, wheelhouse
from tests.conftest import Reliability

pytestmark = pytest.mark.integration  # reads the SBOMs of the wheelhouses make test builds (dist/); make unit does not
ROOT = Path(__file__).parent.parent.parent


def load(kind: str) -> dict[str, Any]:
    path = ROOT / "dist" / f"{kind}.cdx.json"
    if not path.is_file():
        pytest.fail(f"no {path.relative_to(ROOT)}: run make sbom (make test does)")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def disagreements(document: dict[str, Any], pins: list[lockfile.Pin], house: Path) -> list[str]:
    """What the SBOM says that the lock and the wheelhouse do not ([] when it lists exactly them)."""
    found = []
    components = {(c["name"], c.get("version")): c for c in document["components"]}
    listed = {key for key in components if key[0] != "se-exporter"}
    locked = {(p.name, p.version): p for p in pins}
    found += [f"{n}=={v} listed, not locked" for n, v in sorted(listed - locked.keys())]
    found += [f"{n}=={v} locked, not listed" for n, v in sorted(locked.keys() - listed)]
    shipped = sbom.wheel_hashes(house)
    for key in sorted(listed & locked.keys()):
        component, pin = components[key], locked[key]
        allowed = {h["content"] for ref in component.get("externalReferences", []) for h in ref.get("hashes", [])}
        if allowed != set(pin.hashes):
            found.append(f"{key[0]}=={key[1]}: the hashes are not the lock's")
        if {h["content"] for h in component.get("hashes", [])} != set(shipped.get(key, [])):
            found.append(f"{key[0]}=={key[1]}: the hashes are not those of the shipped wheels")
    (own,) = house.glob("se_exporter-*.whl")
    project = [c for c in document["components"] if c["name"] == "se-exporter"]
    if [h["content"] for c in project for h in c.get("hashes", [])] != [wheelhouse.sha256(own)]:
        found.append("se-exporter's own wheel is not listed with its hash")
    return found


@pytest.mark.parametrize("kind", ["linux-wheels", "windows-wheels"])
def test_sbom_lists_exactly_the_locked_runtime_packages(kind: str, reliability: Reliability) -> None:
    """Every component is a pin of requirements/runtime.txt (or se-exporter), every pin is a component, with the
    lock's hashes, and each carries the sha256 of the wheels of it in the wheelhouse."""
    assert disagreements(load(kind), lockfile.read(lockfile.RUNTIME), ROOT / "dist" / kind) == []
    assert load(kind)["bomFormat"] == "CycloneDX"
    reliability("Supply chain", f"the SBOM of the {kind.split('-', maxsplit=1)[0].title()} wheelhouse (make sbom)",
                "CycloneDX; exactly the locked runtime packages and se-exporter, the lock's hashes and the shipped "
                "wheels' sha256")


def test_the_sbom_check_sees_a_missing_an_extra_and_a_changed_package() -> None:
    """A component dropped, one added, and a hash changed are each reported."""
    document, pins, house = load("linux-wheels"), lockfile.read(lockfile.RUNTIME), ROOT / "dist" / "linux-wheels"
    dropped = copy.deepcopy(document)
    dropped["components"] = [c for c in dropped["components"] if c["name"] != "idna"]
    assert any("idna" in f for f in disagreements(dropped, pins, house))
    added = copy.deepcopy(document)
    added["components"].append({"name": "left-pad", "version": "1.0"})
    assert any("left-pad" in f for f in disagreements(added, pins, house))
    changed = copy.deepcopy(document)
    target = next(c for c in changed["components"] if c["name"] == "requests")
    target["hashes"][0]["content"] = "0" * 64
    assert any("requests" in f for f in disagreements(changed, pins, house))
