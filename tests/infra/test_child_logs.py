"""What a failing test's report shows of a child's log: its end, bounded in bytes."""

from __future__ import annotations

from pathlib import Path

from tests.support.child_logs import TAIL_BYTES, tail


def test_a_long_log_is_cut_to_its_last_lines_with_a_note(tmp_path: Path) -> None:
    """A 200 KiB log shows at most TAIL_BYTES of its last whole lines, after a note of what was left out."""
    log = tmp_path / "child.log"
    lines = [f"line {number:06d} " + "x" * 90 for number in range(2000)]
    log.write_text("\n".join(lines) + "\n")

    note, shown = tail(log).split("\n", 1)

    assert len(shown.encode()) <= TAIL_BYTES
    assert shown.endswith(lines[-1] + "\n")
    assert shown.startswith("line ")  # a whole line, not the middle of one
    assert note == f"[... the first {log.stat().st_size - len(shown.encode())} bytes left out; whole log: {log}]"


def test_a_short_log_is_shown_whole_and_a_missing_one_says_so(tmp_path: Path) -> None:
    """A log under the bound is shown as it is; one that cannot be read says why instead of failing the report."""
    log = tmp_path / "child.log"
    log.write_text("started\nfailed: reason\n")

    assert tail(log) == "started\nfailed: reason\n"
    assert tail(tmp_path / "missing.log").startswith(f"(cannot read {tmp_path / 'missing.log'}: ")
