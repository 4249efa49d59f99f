"""Several Ray nodes on one machine (ray.cluster_utils.Cluster), the job submitted through its
entrypoint as `ray job submit` would run it, then verified."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raypack.verify import verify
from tests.conftest import job_config, make_corpus

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": 150 * 2**20, "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


def test_job_entrypoint_on_three_nodes(tmp_path: Path, tokenizer_path: Path, three_nodes: str) -> None:
    corpus = make_corpus(tmp_path, shards=6, docs_per_shard=30, seed=11)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    env = dict(os.environ, RAY_ADDRESS=three_nodes)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "pack_corpus.py"), str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "efficiency" in proc.stdout
    from raypack.config import load_config

    report = verify(str(tmp_path / "out"), load_config(str(cfg)), sample=10)
    assert report.ok, report.problems
    assert report.documents == 180
