"""Entrypoint for Ray jobs:

    ray job submit --working-dir . -- python jobs/pack_corpus.py CONFIG.yaml [--set k=v ...] [--overwrite]

Ray sets RAY_ADDRESS for a submitted job, so the job runs on that cluster; the uploaded working
directory carries the raypack package to every worker (or install it with --runtime-env-json
'{"pip": ["raypack"]}'). Exit codes as for `raypack pack`: 0 done, 1 the input made no dataset, 2 a
configuration or environment mistake (one line on stderr, before any work).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python jobs/pack_corpus.py` puts jobs/ first on sys.path; the package sits one level up in the
# uploaded working directory.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from raypack.cli import main

if __name__ == "__main__":
    sys.exit(main(["pack", *sys.argv[1:]]))
