"""Render the Reliability table of docs/reliability.md from what the last full run of the test suite proved
(.test-results/reliability.json, written by tests/support/reliability.py) and the last soak run
(docs/measurements/soak.json), so the table is produced by the suite, never typed by hand. A partial run (a file, -k,
-m, a failure) writes no rows, and rows not marked as a full run's are refused: the table never shrinks to what one

    python scripts/reliability.py           # rewrite the table in docs/reliability.md
    python scripts/reliability.py --check   # exit 1 if docs/reliability.md differs from what the last run proved
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"
RESULTS = ROOT / ".test-results" / "reliability.json"
PAGE = ROOT / "docs" / "reliability.md"


class NotFullRun(Exception):
    """The recorded rows are missing or were not written by a full run of the suite."""


def full_run_rows(path: Path = RESULTS) -> list[dict[str, str]]:
    """The rows of the last full test run, or NotFullRun saying what to do instead."""
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFullRun(f"no full test run recorded ({shown} is missing): run make test") from None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or recorded.get("run") != "full" or not recorded.get("rows"):
        raise NotFullRun(f"{shown} was not written by a full test run: run make test")
    rows: list[dict[str, str]] = recorded["rows"]
    return rows


def render(rows: list[dict[str, str]]) -> str:
    lines = [START, "", "| area | what was tried | what held |", "|---|---|---|"]
    lines += [f"| {row['area']} | {row['tried']} | {row['held']} |" for row in rows]
    soak = ROOT / "docs" / "measurements" / "soak.json"
    if soak.exists():
        figures = json.loads(soak.read_text())
        lines += ["", f"Soak (`make soak`, {figures['machine']}): {figures['polls']:,} polls of a simulator "
                      f"changing its document every {figures['change_every']} polls on average, "
                      f"{figures['documents']:,} distinct documents; "
                      f"RSS {figures['rss_start_mb']:.1f} → {figures['rss_end_mb']:.1f} MB "
                      f"(growth {figures['rss_growth_mb']:+.2f} MB; measured from one minute after start, the "
                      f"first minute's one-time growth was {figures.get('warm_up_growth_mb', 0.0):+.2f} MB), "
                      f"open files {figures['fds_start']} → "
                      f"{figures['fds_end']}, threads {figures['threads_start']} → {figures['threads_end']}."]
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None, page: Path = PAGE, results: Path = RESULTS) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    shown = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    text = page.read_text()
    if START not in text or END not in text:
        print(f"{shown} has no reliability markers", file=sys.stderr)
        return 1
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    try:
        updated = before + render(full_run_rows(results)) + after
    except NotFullRun as refused:
        print(f"reliability: {refused}", file=sys.stderr)
        return 1
    if args.check:
        if updated != text:
            print(f"{shown}'s Reliability table differs from what the suite proved: run make reliability",
                  file=sys.stderr)
            return 1
        return 0
    page.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
