"""`ray job submit` against a real head, as the README runs it: `ray start --head` on 127.0.0.1 with
token authentication (RAY_AUTH_MODE=token, as Ray 2.60 sets it up), the project directory as the
job's working directory, jobs/pack_corpus.py as the entrypoint; then the output is verified."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from raypack.config import load_config
from raypack.verifier import verify
from tests.conftest import job_config, make_corpus
from tests.s3server import free_ports

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the environment's `ray`, and the `python` the job's entrypoint runs


def ray_cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the ray CLI; a submission that meets a head whose job agent is not up yet (seconds after
    `ray start` returns; over a minute once on a loaded 2-core machine) is tried again, for up to
    three minutes."""
    deadline = time.monotonic() + 180
    while True:
        done = subprocess.run(
            [str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if "No available agent to submit job" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(2)


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, dict[str, str]]]:
    """A head of its own (not the test session's Ray): its own temp dir, so that stopping it kills
    only its processes (`ray stop` would stop every Ray on the machine). PATH starts with this
    environment's bin/, as a cluster image has raypack's dependencies on its PATH."""
    temp = tempfile.mkdtemp(prefix="rp-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(16),
    )
    names = (
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
    )
    gcs, dashboard, *ports = free_ports(2 + len(names))
    started = ray_cli(
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        "--include-dashboard=true",
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        # Ports of its own: the test session's Ray (ray_session) holds the defaults, e.g. its
        # dashboard agent's 52365, and a head whose agent cannot bind never takes a job.
        *(f"--{name}={port}" for name, port in zip(names, ports, strict=True)),
        env=env,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if any(temp in part for part in proc.info["cmdline"] or ()):
                proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_job_submit_packs_on_a_real_head(
    head: tuple[str, dict[str, str]], tmp_path: Path, tokenizer_path: Path
) -> None:
    address, env = head
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=51)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    # The README's command, from the project directory (its .gitignore keeps .venv out of the upload).
    submit = ["job", "submit", "--address", address, "--working-dir", str(ROOT), "--"]
    entry = ["python", "jobs/pack_corpus.py", str(path), "--set", "pack.seq_len=256"]
    done = ray_cli(*submit, *entry, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    assert "efficiency" in done.stdout  # the job's own summary, streamed back
    cfg = load_config(str(path), ["pack.seq_len=256"])
    report = verify(str(tmp_path / "out"), cfg, sample=20)
    assert report.ok, report.problems
    assert report.documents == 60 and report.sampled == 20

    # Token authentication is on: a wrong token is refused before anything runs.
    refused = ray_cli(*submit, "python", "-c", "print('ran')", env={**env, "RAY_AUTH_TOKEN": "not-the-token"})
    assert refused.returncode != 0 and "ran" not in refused.stdout
    assert "auth" in (refused.stdout + refused.stderr).lower()
