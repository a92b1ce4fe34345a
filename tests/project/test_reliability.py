"""The Reliability table (docs/reliability.md) comes from a full run only: partial runs never rewrite its rows, and
the renderer refuses rows no full run wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts import reliability as renderer
from tests.support.reliability import RESULTS

SUITE = {
    "test_rows_one": """
        def test_one(reliability):
            reliability("Area", "tried one", "held")
    """,
    "test_rows_two": """
        import pytest

        @pytest.mark.slow
        def test_two(reliability):
            reliability("Area", "tried two", "held")

        def test_plain():
            assert True
    """,
}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A small suite laid out like ours (testpaths = tests) that records rows with the reliability fixture (its
    conftest puts this repository first on sys.path: pytest-xdist's workers, new interpreters, import
    tests.support.reliability from there)."""
    # Hypothesis' plugin imports hypothesis at every session's end (seconds each); these sessions use none of it.
    pytester.makeini("[pytest]\ntestpaths = tests\naddopts = -p no:hypothesispytest\n"
                     "markers =\n    slow: a marker to select by\n")
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(renderer.ROOT)!r})\n"
                          'pytest_plugins = ["tests.support.reliability"]')
    tests = pytester.mkdir("tests")
    for name, source in SUITE.items():
        pytester.makepyfile(**{f"tests/{name}": source})
    assert tests.is_dir()
    return pytester


def recorded(pytester: pytest.Pytester) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((pytester.path / RESULTS).read_text())
    return loaded


def test_a_full_run_records_every_row_marked_as_full(suite: pytest.Pytester) -> None:
    """A run of every test under testpaths that passes writes all rows, marked as a full run, under .test-results/
    (nothing into build/)."""
    suite.runpytest().assert_outcomes(passed=3)

    assert recorded(suite) == {"run": "full", "tests": 3, "rows": [
        {"area": "Area", "tried": "tried one", "held": "held"}, {"area": "Area", "tried": "tried two", "held": "held"}]}
    assert not (suite.path / "build").exists()


@pytest.mark.parametrize("folder", ["tests", "."])
def test_naming_the_testpaths_or_a_folder_holding_them_is_a_full_run(suite: pytest.Pytester, folder: str) -> None:
    """`pytest tests` and `pytest .` ask for every test `pytest` runs, and record them."""
    suite.runpytest(folder).assert_outcomes(passed=3)

    assert recorded(suite)["run"] == "full"


def test_a_full_run_on_parallel_workers_records_what_a_serial_run_records(suite: pytest.Pytester) -> None:
    """Run on two pytest-xdist workers (as make test runs it), each recording a row, a full run writes the same
    file as a serial run: the workers' rows reach the controller, which alone writes them."""
    suite.runpytest().assert_outcomes(passed=3)
    serial = recorded(suite)
    (suite.path / RESULTS).unlink()

    result = suite.runpytest("-n", "2", "--dist", "loadfile", "-v")

    result.assert_outcomes(passed=3)
    workers = {re.search(r"\[(gw\d)\]", line).group(1)  # type: ignore[union-attr]
               for line in result.outlines if "PASSED tests/test_rows_" in line and "test_plain" not in line}
    assert workers == {"gw0", "gw1"}  # one row recorded on each worker
    assert recorded(suite) == serial


@pytest.mark.parametrize("args", [
    ("tests/test_rows_one.py",),
    ("tests/test_rows_one.py::test_one", "tests/test_rows_two.py"),
    ("-k", "one"),
    ("-m", "not slow"),
    ("--deselect", "tests/test_rows_two.py::test_plain"),
    ("--ignore", "tests/test_rows_two.py"),
    ("--collect-only",),
    ("--lf",),
    ("--sw",),
    ("-n", "2", "-k", "one"),
    ("-n", "2", "-m", "not slow"),
    ("-n", "2", "tests/test_rows_one.py"),
], ids=["a file", "a node id", "-k", "-m", "--deselect", "--ignore", "--collect-only", "--lf", "--sw",
        "-k on workers", "-m on workers", "a file on workers"])
def test_a_partial_run_leaves_the_last_full_runs_rows_alone(suite: pytest.Pytester, args: tuple[str, ...]) -> None:
    """After a full run, a run of part of the suite (a file, a node id, -k, -m, --deselect, --ignore,
    --collect-only, --lf, --sw) leaves the recorded rows byte for byte as the full run wrote them, and says so."""
    suite.runpytest().assert_outcomes(passed=3)
    before = (suite.path / RESULTS).read_bytes()

    result = suite.runpytest(*args)

    assert (suite.path / RESULTS).read_bytes() == before
    if "--collect-only" not in args:
        result.stdout.fnmatch_lines(["Reliability rows not recorded: a partial run (*"])


@pytest.mark.parametrize("args", [(), ("-x",), ("-n", "2")], ids=["failure", "-x stop", "failure on workers"])
def test_a_failing_run_records_nothing(suite: pytest.Pytester, args: tuple[str, ...]) -> None:
    """A run of the whole suite with a failing test (run to the end, or stopped by -x) writes no rows: what failed
    did not hold, and what it would have recorded after the failure is missing."""
    # Collected between test_rows_one and test_rows_two: -x stops after one row was recorded.
    suite.makepyfile(**{"tests/test_rows_one_broken": "def test_broken():\n    assert False\n"})

    result = suite.runpytest(*args)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not (suite.path / RESULTS).exists()


def test_the_renderer_takes_a_full_runs_rows(tmp_path: Path) -> None:
    """Rows a full run wrote render as the table's rows."""
    results = tmp_path / "reliability.json"
    results.write_text(json.dumps({"run": "full", "tests": 1, "rows": [{"area": "A", "tried": "t", "held": "h"}]}))

    rows = renderer.full_run_rows(results)

    assert "| A | t | h |" in renderer.render(rows).splitlines()


@pytest.mark.parametrize("content", [None, '[{"area": "A", "tried": "t", "held": "h"}]', '{"run": "partial"}', "{"],
                         ids=["missing", "old list of rows", "not full", "not JSON"])
def test_the_renderer_refuses_rows_no_full_run_wrote(tmp_path: Path, content: str | None) -> None:
    """Without rows marked as a full run's, the renderer refuses with one line that says to run make test."""
    results = tmp_path / "reliability.json"
    if content is not None:
        results.write_text(content)

    with pytest.raises(renderer.NotFullRun) as refused:
        renderer.full_run_rows(results)

    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith("run make test")


def full_results(tmp_path: Path) -> Path:
    results = tmp_path / "reliability.json"
    results.write_text(json.dumps({"run": "full", "tests": 1, "rows": [{"area": "A", "tried": "t", "held": "h"}]}))
    return results


def test_the_renderer_rewrites_the_table_between_the_markers_of_the_page(tmp_path: Path) -> None:
    """`make reliability` rewrites what lies between the markers of the page, and nothing around them; `--check`
    then passes, and fails (exit 1) once the table is edited by hand."""
    page = tmp_path / "reliability.md"
    page.write_text(f"# Reliability\n\nbefore\n\n{renderer.START}\n\nstale\n\n{renderer.END}\n\nafter\n")
    results = full_results(tmp_path)

    assert renderer.main(["--check"], page=page, results=results) == 1
    assert renderer.main([], page=page, results=results) == 0

    text = page.read_text()
    assert text.startswith("# Reliability\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "| A | t | h |" in text and "stale" not in text
    assert renderer.main(["--check"], page=page, results=results) == 0
    page.write_text(text.replace("| A | t | h |", "| A | t | edited |"))
    assert renderer.main(["--check"], page=page, results=results) == 1


def test_the_table_lives_in_docs_reliability_md() -> None:
    """The renderer writes docs/reliability.md, which holds the markers once; the README, the user's guide, holds
    none (it links to the page)."""
    page = renderer.ROOT / "docs" / "reliability.md"
    text = page.read_text()

    assert page == renderer.PAGE
    assert text.count(renderer.START) == 1 and text.count(renderer.END) == 1
    assert text.index(renderer.START) < text.index(renderer.END)
    readme = (renderer.ROOT / "README.md").read_text()
    assert renderer.START not in readme and renderer.END not in readme
    assert "(docs/reliability.md)" in readme


def test_a_page_without_markers_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A page whose markers are gone is left alone and refused with one line naming it."""
    page = tmp_path / "reliability.md"
    page.write_text("# Reliability\n")

    assert renderer.main([], page=page, results=full_results(tmp_path)) == 1

    assert page.read_text() == "# Reliability\n"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no reliability markers" in err
