"""``python -m se_exporter`` runs the CLI."""

from __future__ import annotations

import sys

from se_exporter.cli import main

sys.exit(main())
