"""The release artefacts: ``python -m build`` makes an sdist and a wheel that ``twine check --strict`` accepts, with
the metadata the package index shows (readme, licence, classifiers, links, requires-python). Built from a copy of
the checkout with the venv's own setuptools (no isolation: nothing is fetched), so the checkout gets no build/."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).parent.parent.parent
SOURCES = ("pyproject.toml", "README.md", "LICENSE")


def _copy(target: Path) -> Path:
    target.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(ROOT / "se_exporter", target / "se_exporter",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def _build(source: Path, dist: Path) -> list[Path]:
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sorted(dist.iterdir())


def _twine_check(files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("release")
    return _build(_copy(base / "source"), base / "dist")


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as bundle:
        (name,) = [n for n in bundle.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(bundle.read(name).decode())


def test_sdist_and_wheel_pass_twine_check_strict(built: list[Path]) -> None:
    """One sdist and one pure-Python wheel of the package's version, both accepted by twine check --strict."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"].replace("-", "_")
    from se_exporter import __version__  # noqa: PLC0415 - the version the build reads

    assert [p.name for p in built] == [f"{version}-{__version__}-py3-none-any.whl", f"{version}-{__version__}.tar.gz"]
    result = _twine_check(built)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2


def test_the_index_shows_the_readme_licence_classifiers_and_links(built: list[Path]) -> None:
    """The wheel's metadata carries the README as Markdown, the MIT licence as an SPDX expression with the LICENSE
    file inside both artefacts, requires-python, a classifier for every supported Python and the project's links."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    metadata = _metadata(built[0])
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Requires-Python"] == project["requires-python"] == ">=3.10"
    classifiers = metadata.get_all("Classifier") or []
    assert {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12)} <= set(classifiers)
    assert not [c for c in classifiers if c.startswith("License ::")], "the SPDX expression replaces them"
    links = dict(link.split(", ", 1) for link in metadata.get_all("Project-URL") or [])
    assert set(links) >= {"Homepage", "Source", "Issues", "Changelog"}
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "se-exporter contributors" in licence
    with zipfile.ZipFile(built[0]) as wheel:
        assert wheel.read(next(n for n in wheel.namelist() if n.endswith("licenses/LICENSE"))).decode() == licence
    with tarfile.open(built[1]) as sdist:
        names = sdist.getnames()
        member = sdist.extractfile(next(n for n in names if n.endswith("/LICENSE") and n.count("/") == 1))
        assert member is not None and member.read().decode() == licence
        assert any(n.endswith("/se_exporter/simulator/scenarios/live-migration.json") for n in names)


def test_twine_check_would_refuse_a_readme_the_index_cannot_render(tmp_path: Path) -> None:
    """The check can fail: the same package with its README declared reStructuredText (which the Markdown is not)
    is refused."""
    source = _copy(tmp_path / "source")
    pyproject = source / "pyproject.toml"
    text = pyproject.read_text()
    assert 'readme = "README.md"' in text
    pyproject.write_text(text.replace('readme = "README.md"',
                                      'readme = { file = "README.md", content-type = "text/x-rst" }'))
    result = _twine_check(_build(source, tmp_path / "dist"))
    assert result.returncode != 0 and "FAILED" in result.stdout, result.stdout
