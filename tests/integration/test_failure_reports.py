"""A failing integration test shows the logs of the processes it started, in pytest's own failure report."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parent.parent.parent

SUITE = '''
import pytest

from tests.support.helpers import Sidecar, free_port


def test_a_sidecar_then_a_failure(tmp_path):
    process = Sidecar(["--imds-url", f"http://127.0.0.1:{free_port()}"], tmp_path / "sidecar0")
    try:
        pytest.fail("failing on purpose")
    finally:
        process.stop()


def test_a_sidecar_and_no_failure(tmp_path):
    Sidecar(["--imds-url", f"http://127.0.0.1:{free_port()}"], tmp_path / "sidecar7").stop()


def test_a_failure_alone():
    pytest.fail("failing on purpose, with no process of its own")
'''


def test_a_failing_test_shows_the_log_of_the_sidecar_it_started(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pytest run of its own, a test that started a sidecar and failed shows the sidecar's stderr (its start-up
    line) in the failure report; a passing test, and a failing one that started no process, show no process log."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the child pytest imports this suite's helpers
    pytester.makeini("[pytest]\naddopts = -p no:hypothesispytest -p no:cacheprovider\n")
    pytester.makeconftest('pytest_plugins = ["tests.support.process_logs"]')
    pytester.makepyfile(test_started=SUITE)

    result = pytester.runpytest_subprocess(timeout=120)

    result.assert_outcomes(passed=1, failed=2)
    report = result.stdout.str()
    first, alone = report.split("_ test_a_sidecar_then_a_failure _")[1].split("_ test_a_failure_alone _")
    assert "log of sidecar0 (se-exporter run, pid " in first
    assert "se-exporter 0.1.0 polling http://127.0.0.1:" in first  # written by the child, to its own stderr
    assert "log of" not in alone
    assert "sidecar7" not in report
