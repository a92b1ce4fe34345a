"""The Windows wheelhouse ``deploy/windows/install.ps1`` installs offline.

    python scripts/windows_wheels.py [--dest dist/windows-wheels]

Every dependency requirements/runtime.txt locks for Windows (its markers evaluated for win_amd64, so what only
Windows needs is there), as a win_amd64 or pure-Python wheel for CPython 3.10 to 3.12 (one fails named if it has
none), se-exporter's own wheel, and requirements.txt naming each by hash; also zipped beside the folder
(windows-wheels.zip, what install.ps1 installs from). See scripts/wheelhouse.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from wheelhouse import ROOT, archive, build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "dist" / "windows-wheels")
    args = parser.parse_args(argv)
    wheels = build(args.dest, "windows")
    print(f"{len(wheels)} wheels (win_amd64, CPython 3.10-3.12) in {args.dest} and "
          f"{archive(args.dest, 'windows').name} (for install.ps1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
