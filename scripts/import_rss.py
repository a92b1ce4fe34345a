"""What the sidecar's RSS is made of: ``python scripts/import_rss.py MODULE...`` imports the modules one after the
other in a fresh interpreter and prints, as JSON, the RSS after each (the first entry is the bare interpreter).

An import's share depends on what came before it (a module imported by an earlier one costs nothing later), so
bench.py passes them in the order the sidecar's own start-up would bring them in, beginning with the standard
library pieces that the third-party ones pull in (ssl for http.client and httpx, asyncio for the forwarder).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path


def rss_mb() -> float:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(match.group(1)) / 1024 if match else 0.0


if __name__ == "__main__":
    steps = [["(interpreter)", rss_mb()]]
    for name in sys.argv[1:]:
        importlib.import_module(name)
        steps.append([name, rss_mb()])
    print(json.dumps(steps))
