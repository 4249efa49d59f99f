"""Entrypoint for scheduled rebuilds through Ray jobs:

    ray job submit --working-dir . -- python jobs/rebuild.py CONFIG.yaml [--set k=v ...]

Exactly `raypack rebuild`: writes output.path/v=NNNNNN/, tokenizing only new or changed input shards
(the others come from output.path/_cache/), then moves output.path/LATEST to it. Safe to rerun after a
failure: LATEST still names the previous complete version, and finished token files are reused.
Exit codes: 0 done, 1 the input made no dataset, 2 a configuration or environment mistake.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python jobs/rebuild.py` puts jobs/ first on sys.path; the package sits one level up in the uploaded
# working directory (or is installed in the image).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raypack.cli import main

if __name__ == "__main__":
    sys.exit(main(["rebuild", *sys.argv[1:]]))
