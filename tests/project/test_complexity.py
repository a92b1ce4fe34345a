"""No function of the package is above radon's grade C (cyclomatic complexity over 20), and at most MAX_GRADE_C are
of grade C (11 to 20): a function that branches more than that is split by responsibility before it lands, so each
still fits on a screen and a table of cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radon.complexity import cc_rank, cc_visit

PACKAGE = Path(__file__).parent.parent.parent / "se_exporter"
MAX_GRADE_C = 35


def functions(source: str) -> list[Any]:
    """Every function and method of ``source`` once (radon's visitor gives a class, then its methods again on their
    own), classes left out."""
    return [block for block in cc_visit(source) if not hasattr(block, "methods")]


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


def test_at_most_max_grade_c_functions_are_of_grade_c() -> None:
    """Grade C (complexity 11 to 20) is allowed, a few times: more than MAX_GRADE_C, and one is split first."""
    graded = [f"{path.relative_to(PACKAGE.parent)}:{item.lineno} {item.fullname} ({item.complexity})"
              for path in sorted(PACKAGE.rglob("*.py")) for item in functions(path.read_text(encoding="utf-8"))
              if cc_rank(item.complexity) == "C"]
    assert len(graded) <= MAX_GRADE_C, "\n".join(graded)


def test_the_count_sees_a_function_of_grade_c_and_not_a_class() -> None:
    body = "".join(f"    if x == {n}:\n        return {n}\n" for n in range(11))
    source = f"def f(x):\n{body}    return -1\n\nclass K:\n    def g(self):\n        return 1\n"
    assert [(item.name, cc_rank(item.complexity)) for item in functions(source)] == [("f", "C"), ("g", "A")]
