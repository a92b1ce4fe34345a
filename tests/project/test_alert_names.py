"""Every alert name written where users read it (the README, docs/, the chart's README, the example Alertmanager
configuration, the dashboards) is an alert the shipped rules define: a route, silence or inhibition copied from the
docs matches something, and a runbook never sends an operator after an alert that no longer exists. The names come
from the rule files themselves, so a renamed alert fails here until every text that names it follows. The earlier
names live on only in the rename table of docs/alerting.md (and in the CHANGELOG's history, not checked)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent.parent
ALERTING = ROOT / "docs" / "alerting.md"
# One of ours: every alert starts with the prefix. A trailing `*` is prose for "every alert starting so".
OURS = re.compile(r"\bSeExporter[A-Z]\w*\*?")
# A regular expression on the alert's name, as Alertmanager's matchers and PromQL's ALERTS{} write it.
REGEX_MATCHER = re.compile(r"""alertname\s*=~\s*(?:"([^"]*)"|'([^']*)')""")
RENAME_HEADER = "| Earlier name | Now |"


def shipped() -> frozenset[str]:
    names = set()
    for path in (ROOT / "dashboards").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(rule["alert"] for rule in group["rules"] if "alert" in rule)
    return frozenset(names)


def rename_rows() -> list[str]:
    """The rows of docs/alerting.md's rename table: the one place the earlier names stay, on purpose."""
    lines = ALERTING.read_text().splitlines()
    start = lines.index(RENAME_HEADER) + 2  # past the header and its |---|---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def earlier_names() -> frozenset[str]:
    return frozenset(re.findall(r"^\| `(\w+)` \|", "\n".join(rename_rows()), re.MULTILINE))


def texts() -> Iterator[tuple[str, str]]:
    """(relative path, text) of every file users read alert names in; the rename table's rows left out."""
    paths = [ROOT / "README.md", ROOT / "charts" / "se-exporter" / "README.md",
             ROOT / "deploy" / "alertmanager" / "alertmanager.yml",
             *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "dashboards").glob("*.json"))]
    rows = set(rename_rows())
    for path in paths:
        text = path.read_text()
        if path == ALERTING:
            text = "\n".join(line for line in text.splitlines() if line not in rows)
        yield str(path.relative_to(ROOT)), text


def branches(pattern: str) -> list[str]:
    """The alternatives of a regular expression, each without `|`: `A(B|C.+)` is `A(?:B)` and `A(?:C.+)`.

    Enough of the syntax for matchers on names (groups, alternation, escapes, a quantifier after a group)."""

    def alternatives(at: int) -> tuple[list[str], int]:
        done: list[str] = []
        current = [""]
        while at < len(pattern) and pattern[at] != ")":
            char = pattern[at]
            if char == "\\":
                current = [seen + pattern[at:at + 2] for seen in current]
                at += 2
            elif char == "(":
                at += 3 if pattern.startswith("(?:", at) else 1
                inner, at = alternatives(at)
                at += 1  # the closing parenthesis
                quantifier = pattern[at] if at < len(pattern) and pattern[at] in "?*+" else ""
                at += len(quantifier)
                current = [seen + f"(?:{one}){quantifier}" for seen in current for one in inner]
            elif char == "|":
                done += current
                current = [""]
                at += 1
            else:
                current = [seen + char for seen in current]
                at += 1
        return done + current, at

    return alternatives(0)[0]


def test_branches_splits_nested_alternatives() -> None:
    """The splitter the checks below rely on gives every alternative of a nested matcher, and no more."""
    assert branches("SeExporter(ImpactfulEvent.+|Fleet(A|B)C)") == [
        "SeExporter(?:ImpactfulEvent.+)", "SeExporter(?:Fleet(?:A)C)", "SeExporter(?:Fleet(?:B)C)"]
    assert branches(r"A\|B|C") == [r"A\|B", "C"]


def test_the_rules_ship_alerts_and_the_rename_table_lists_earlier_names() -> None:
    """Both sides of the comparison are there: an empty set would let every check below pass."""
    assert len(shipped()) >= 20
    assert "SeExporterHostFailure" in shipped()
    assert "AzureHostFailure" in earlier_names() and not earlier_names() & shipped()


@pytest.mark.parametrize("text", [pytest.param(text, id=path) for path, text in texts()])
def test_every_alert_named_is_shipped(text: str) -> None:
    """Every `SeExporter...` name, every alternative of a regex on alertname, and no earlier name."""
    names = shipped()
    unknown = set()
    for match in REGEX_MATCHER.finditer(text):
        for branch in branches(match.group(1) if match.group(1) is not None else match.group(2)):
            if not any(re.fullmatch(branch, name) for name in names):
                unknown.add(f"alertname=~ alternative {branch!r}")
    for token in OURS.findall(REGEX_MATCHER.sub("", text)):
        if token.endswith("*"):
            if not any(name.startswith(token[:-1]) for name in names):
                unknown.add(token)
        elif token not in names:
            unknown.add(token)
    unknown.update(name for name in earlier_names() if re.search(rf"\b{name}\b", text))
    assert not unknown, f"alerts the rules do not ship: {sorted(unknown)}"
