"""No function of the package is above radon's grade C (cyclomatic complexity over 20): a function that branches
more than that is split by responsibility before it lands, so each still fits on a screen and a table of cases."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

PACKAGE = Path(__file__).parent.parent.parent / "se_exporter"


def too_complex(source: str, path: str) -> list[str]:
    """Every function or method of ``source`` above grade C, as ``path:line name (grade complexity)``."""
    found = []
    for block in cc_visit(source):
        for item in [block, *getattr(block, "methods", [])]:
            if cc_rank(item.complexity) not in "ABC":
                found.append(f"{path}:{item.lineno} {item.fullname} ({cc_rank(item.complexity)} {item.complexity})")
    return sorted(set(found))


def test_no_function_of_the_package_is_above_grade_c() -> None:
    """Every module of se_exporter, every function and method (nested ones included by radon's visitor)."""
    found = [line for path in sorted(PACKAGE.rglob("*.py"))
             for line in too_complex(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert found == []


def test_the_check_sees_a_function_of_grade_d() -> None:
    """A function of 21 branches is reported, so the check above can fail."""
    body = "".join(f"    if x == {n}:\n        return {n}\n" for n in range(21))
    assert too_complex(f"def f(x):\n{body}    return -1\n", "m.py") == ["m.py:1 f (D 22)"]
