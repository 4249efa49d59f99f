"""`ray job submit` and `raypack pack` against a real head, as docs/operations.md runs them: the token
made by `ray get-auth-token --generate` into ~/.ray/auth_token, `ray start --head` on 127.0.0.1 with
RAY_AUTH_MODE=token, the project directory as the job's working directory, jobs/pack_corpus.py as the
entrypoint; then the output is verified."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Head:
    """A head with token authentication on, and the environment of a shell set up as
    docs/operations.md says: the token in ~/.ray/auth_token (of a HOME of its own) and, for the ray
    CLI, RAY_AUTH_MODE=token."""

    dashboard: str
    gcs: str
    client: str
    shell: dict[str, str]

    def bare(self, **extra: str) -> dict[str, str]:
        """The shell without RAY_AUTH_MODE: what a user who only has the token file meets."""
        return {**{k: v for k, v in self.shell.items() if k != "RAY_AUTH_MODE"}, **extra}


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    """A head of its own (not the test session's Ray): its own temp dir, so that stopping it kills
    only its processes (`ray stop` would stop every Ray on the machine). PATH starts with this
    environment's bin/, as a cluster image has raypack's dependencies on its PATH. The token is made
    as Ray's own message says (`ray get-auth-token --generate`), the head started with
    RAY_AUTH_MODE=token."""
    temp = tempfile.mkdtemp(prefix="rp-", dir="/tmp")  # short: Ray's socket paths live under it
    home = Path(temp) / "home"
    home.mkdir()
    shell = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    shell.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", HOME=str(home))
    made = ray_cli("get-auth-token", "--generate", env=shell, timeout=60)
    assert (home / ".ray" / "auth_token").is_file(), made.stdout + made.stderr
    shell["RAY_AUTH_MODE"] = "token"
    names = (
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
        "node-manager-port",
        "object-manager-port",
    )
    gcs, dashboard, client, *ports = free_ports(3 + len(names))
    started = ray_cli(
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}",
        "--include-dashboard=true",
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        # Ports of its own: the test session's Ray (ray_session) holds the defaults, e.g. its
        # dashboard agent's 52365, and a head whose agent cannot bind never takes a job.
        *(f"--{name}={port}" for name, port in zip(names, ports, strict=True)),
        env=shell,
        timeout=180,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield Head(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", f"ray://127.0.0.1:{client}", shell)
    finally:
        for proc in psutil.process_iter(["cmdline"]):
            if any(temp in part for part in proc.info["cmdline"] or ()):
                proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_job_submit_packs_on_a_real_head(head: Head, tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=51)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    # The documented command, from the project directory (its .gitignore keeps .venv out of the upload).
    submit = ["job", "submit", "--address", head.dashboard, "--working-dir", str(ROOT), "--"]
    entry = ["python", "jobs/pack_corpus.py", str(path), "--set", "pack.seq_len=256"]
    done = ray_cli(*submit, *entry, env=head.shell)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    assert "efficiency" in done.stdout  # the job's own summary, streamed back
    cfg = load_config(str(path), ["pack.seq_len=256"])
    report = verify(str(tmp_path / "out"), cfg, sample=20)
    assert report.ok, report.problems
    assert report.documents == 60 and report.sampled == 20

    # Token authentication is on: a wrong token is refused before anything runs.
    wrong = {**head.shell, "RAY_AUTH_TOKEN": "not-the-token"}
    refused = ray_cli(*submit, "python", "-c", "print('ran')", env=wrong)
    assert refused.returncode != 0 and "ran" not in refused.stdout
    assert "auth" in (refused.stdout + refused.stderr).lower()


def raypack_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run(
        [str(BIN / "raypack"), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done, time.monotonic() - t0


def test_raypack_pack_joins_a_token_cluster_with_the_token_file_alone(
    head: Head, tmp_path: Path, tokenizer_path: Path
) -> None:
    """`raypack pack` with RAY_ADDRESS from a shell that has the token in ~/.ray/auth_token but not
    RAY_AUTH_MODE: it finds the token (Ray's own connection times out after ~20 s and says only that
    it failed to connect). The config's paths are relative to the user's directory, not the head's:
    the head's tasks wrote data/ and index/ under their own working directory, the driver the
    manifest here."""
    make_corpus(tmp_path, shards=2, docs_per_shard=15, seed=52)
    shutil.copy(tokenizer_path, tmp_path / "tok.json")
    path = job_config(tmp_path, "corpus/*", "tok.json", output={"path": "out"})
    env = head.bare(RAY_ADDRESS=head.gcs)
    done, _ = raypack_cli("pack", str(path), "--set", "pack.seq_len=256", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on 2 Ray CPUs" in done.stdout  # the head's, not this machine's pool
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "data",
        "index",
        "manifest.json",
        "metrics.json",
        "report.html",
    ]
    verified, _ = raypack_cli("verify", "out", env=env, cwd=tmp_path)  # the settings the manifest records
    assert verified.returncode == 0 and "30 documents" in verified.stdout, verified.stdout + verified.stderr
    assert "re-tokenized and equal" in verified.stdout


@pytest.mark.parametrize("form", ["gcs", "client"])
def test_a_token_cluster_without_a_token_is_one_line_at_once(
    head: Head, tmp_path: Path, tokenizer_path: Path, form: str
) -> None:
    """No token in the shell (another HOME): one line naming where the token goes, exit 2, in seconds;
    a wrong token: one line that it was refused. Ray's own errors come after 20-30 s ("Failed to
    connect", "ray client connection timeout") and raypack used to call them storage errors."""
    address = head.gcs if form == "gcs" else head.client
    path = job_config(tmp_path, f"{make_corpus(tmp_path, shards=1, docs_per_shard=3)}/*", tokenizer_path)
    (tmp_path / "home").mkdir()
    for env, said in (
        (head.bare(RAY_ADDRESS=address, HOME=str(tmp_path / "home")), "~/.ray/auth_token"),
        (head.bare(RAY_ADDRESS=address, RAY_AUTH_TOKEN="not-the-token"), "refused this shell's token"),
    ):
        done, took = raypack_cli("pack", str(path), env=env)
        assert done.returncode == 2, done.stderr[-3000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("raypack: error: "), done.stderr[-3000:]
        assert "token authentication" in lines[0] or said in lines[0]
        assert said in lines[0]
        assert took < 15, took  # Ray's own timeouts are 20-30 s
