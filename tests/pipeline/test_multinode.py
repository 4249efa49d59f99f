"""Several Ray nodes on one machine (ray.cluster_utils.Cluster), the job submitted through its
entrypoint as `ray job submit` would run it, then verified; then with inputs and output on the S3
server, a worker node killed mid-run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from raypack.verifier import verify
from tests import s3server
from tests.conftest import job_config, make_corpus, s3_job_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Any]:
    """The nodes inherit this process's environment, so the S3 credentials too (once the s3 fixture
    has set them), as a real cluster's nodes hold theirs."""
    from ray.cluster_utils import Cluster

    os.environ.update(s3server.CREDENTIALS)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": 150 * 2**20, "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _pack_on(cluster: Any, cfg: Path) -> subprocess.CompletedProcess[str]:
    """The job's entrypoint on the cluster, as `ray job submit` runs it; it must succeed."""
    env = dict(os.environ, RAY_ADDRESS=cluster.address)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "pack_corpus.py"), str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# 47 s: the light tier runs the entrypoint through `ray job submit` (test_submit) and three nodes
# in test_a_node_dies_mid_run_on_s3.
@pytest.mark.slow
def test_job_entrypoint_on_three_nodes(tmp_path: Path, tokenizer_path: Path, three_nodes: Any) -> None:
    corpus = make_corpus(tmp_path, shards=6, docs_per_shard=30, seed=11)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    proc = _pack_on(three_nodes, cfg)
    assert "efficiency" in proc.stdout
    assert "[raypack] exchange: 3 assign, 0 merge, " in proc.stderr  # a run of shards a CPU, 3 nodes
    from raypack.config import load_config

    report = verify(str(tmp_path / "out"), load_config(str(cfg)), sample=10)
    assert report.ok, report.problems
    assert report.documents == 180


@pytest.mark.parametrize("fmt", [pytest.param("parquet", marks=pytest.mark.slow), "jsonl"])
def test_one_large_file_is_tokenized_on_several_nodes(
    tmp_path: Path, tokenizer_path: Path, three_nodes: Any, fmt: str
) -> None:
    """A single input file, split into work units (input.unit_bytes: runs of row groups of a Parquet
    file, byte ranges of a JSONL file, whose lines are counted by tasks on the cluster), is
    tokenized on every one of the three nodes, each given its share of the units whatever how fast
    the first finishes (metrics.json counts the nodes of each split file), and the result verifies."""
    import json
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import random_text

    rng = random.Random(4)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [random_text(rng, int(rng.lognormvariate(4.5, 1.0)) + 1) for _ in range(600)]
    one = corpus / f"one.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), one, row_group_size=25)
    else:
        one.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    unit = one.stat().st_size // 12
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"format": fmt, "unit_bytes": unit})
    _pack_on(three_nodes, cfg)
    split = json.loads((tmp_path / "out" / "metrics.json").read_text())["split_files"]
    assert split[one.name]["units"] >= 8 and split[one.name]["nodes"] == 3, split
    from raypack.config import load_config

    report = verify(str(tmp_path / "out"), load_config(str(cfg)), sample=20)
    assert report.ok, report.problems
    assert report.documents == 600


def test_a_node_dies_mid_run_on_s3(tmp_path: Path, tokenizer_path: Path, three_nodes: Any, s3: Any) -> None:
    """Runs last in this module: it takes a worker node away. Ray retries the lost work, or the job
    fails cleanly (no manifest, one-line error) and a rerun succeeds; either way verify passes."""
    fs = s3.filesystem()
    prefix = f"{s3server.BUCKET}/multinode"
    corpus = make_corpus(tmp_path, shards=12, docs_per_shard=150, seed=21)
    cfg = s3_job_config(tmp_path, s3, corpus, tokenizer_path, "multinode", tokenizer={"concurrency": 3})
    env = dict(os.environ, RAY_ADDRESS=three_nodes.address)
    command = [sys.executable, str(ROOT / "jobs" / "pack_corpus.py"), str(cfg), "--overwrite"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # Wait until tokenization is under way (token files appear in the staging area), then kill a node.
    deadline = time.monotonic() + 120
    staged = pafs.FileSelector(f"{prefix}/out/_staging/tokens", allow_not_found=True)
    while not [i for i in fs.get_file_info(staged) if i.base_name.endswith(".arrow")]:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "tokenization never started"
        time.sleep(0.2)
    victim = three_nodes.list_all_nodes()[-1]
    three_nodes.remove_node(victim, allow_graceful=False)
    _, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        # A clean failure: an error a user can read, and nothing that looks like a finished dataset.
        assert proc.returncode == 1, err[-3000:]
        assert "Traceback" not in err.splitlines()[-1]
        assert fs.get_file_info(f"{prefix}/out/manifest.json").type == pafs.FileType.NotFound
        rerun = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
    from raypack.config import load_config

    report = verify(f"s3://{prefix}/out", load_config(str(cfg)), sample=20)
    assert report.ok, report.problems
    assert report.documents == 12 * 150
