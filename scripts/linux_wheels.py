"""The Linux wheelhouse ``deploy/systemd/install.sh`` and the scale-set custom script install offline.

    python scripts/linux_wheels.py [--dest dist/linux-wheels]

Every dependency requirements/runtime.txt locks, as a wheel for manylinux x86_64 and aarch64 and CPython 3.10 to
3.12 (one fails named if it has none), se-exporter's own wheel, and requirements.txt naming each by hash; also as
linux-wheels.tar.gz beside the folder. See scripts/wheelhouse.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from wheelhouse import ROOT, archive, build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "dist" / "linux-wheels")
    args = parser.parse_args(argv)
    wheels = build(args.dest, "linux")
    print(f"{len(wheels)} wheels (manylinux x86_64 and aarch64, CPython 3.10-3.12) in {args.dest} and "
          f"{archive(args.dest, 'linux').name} (for install.sh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
