"""The job against a real S3 server (SeaweedFS): inputs, tokenizer and output in object storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from raypack.cli import main
from raypack.config import load_config
from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.storage import expand_inputs
from raypack.verifier import verify
from tests import s3server
from tests.conftest import job_config, make_corpus, s3_job_config

ROOT = Path(__file__).resolve().parents[2]


def s3_config(tmp: Path, server: s3server.S3Server, tokenizer: Path, prefix: str) -> Path:
    corpus = make_corpus(tmp, shards=5, docs_per_shard=30, seed=4)
    return s3_job_config(tmp, server, corpus, tokenizer, prefix)


def fs_size(server: s3server.S3Server, name: str) -> int:
    return int(server.filesystem().get_file_info(f"{s3server.BUCKET}/equal/corpus/{name}").size)


def read_tree(fs: pafs.FileSystem, root: str, under: str) -> dict[str, bytes]:
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{under}", recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                out[info.path[len(root) + 1 :]] = f.read()
    return out


def test_pack_on_s3_equals_pack_on_local_disk(tmp_path: Path, tokenizer_path: Path, s3) -> None:
    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "equal")
    # On S3 the uncompressed JSONL files are cut into byte ranges (their lines counted by ranged
    # reads); the compressed ones stay whole. The packs must not tell.
    cfg = load_config(str(cfg_path), ["input.unit_bytes=1500"])
    result = run_job(cfg, log=lambda _: None)
    report = verify(cfg.output.path, cfg, sample=20)
    assert report.ok, report.problems
    assert report.documents == result.documents == 150

    # The same corpus and tokenizer from local disk: every data and index file byte for byte equal.
    local = load_config(
        str(cfg_path),
        [
            f"input.paths=['{tmp_path}/corpus/*']",
            f"tokenizer.path={tokenizer_path}",
            f"output.path={tmp_path}/o",
        ],
    )
    run_job(local, log=lambda _: None)
    remote = read_tree(s3.filesystem(), f"{s3server.BUCKET}/equal/out", "data")
    on_disk = read_tree(pafs.LocalFileSystem(), str(tmp_path / "o"), "data")
    assert remote and remote == on_disk
    manifest = json.loads(
        s3.filesystem().open_input_stream(f"{s3server.BUCKET}/equal/out/manifest.json").read()
    )
    inputs = manifest["inputs"]
    assert list(dict.fromkeys(i["path"] for i in inputs)) == [
        f"part-{i:03d}.{k}" for i, k in enumerate(["jsonl", "jsonl.gz", "jsonl.zst", "jsonl", "jsonl.gz"])
    ]
    for path in ("part-000.jsonl", "part-003.jsonl"):
        ranges = [i["bytes"] for i in inputs if i["path"] == path]
        assert len(ranges) >= 2 and ranges[0][0] == 0 and ranges[-1][1] == fs_size(s3, path)
    assert all("bytes" not in i for i in inputs if not i["path"].endswith(".jsonl"))


@pytest.mark.parametrize("runs", [2, pytest.param(20, marks=pytest.mark.slow)])
def test_the_same_job_on_s3_again_and_again(tmp_path: Path, tokenizer_path: Path, s3, runs: int) -> None:
    """What a schedule does: the same `raypack pack --overwrite`, inputs, tokenizer and output on S3,
    run after run, each a process of its own on the default executor (9 runs in 10 failed when the
    workers were forks holding the driver's S3 connection). Every run passes and verifies, writes
    the same data, and leaves nothing in its working directory."""
    cfg_path = s3_config(tmp_path, s3, tokenizer_path, f"again{runs}")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "raypack.cli", "pack", str(cfg_path), "--overwrite", "--quiet"]
    cfg = load_config(str(cfg_path))
    first: dict[str, bytes] = {}
    for run in range(runs):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=work)
        assert done.returncode == 0, f"run {run + 1} of {runs}: {done.stderr[-2000:]}"
        assert "local processes" in done.stdout
        report = verify(cfg.output.path, cfg, sample=10)
        assert report.ok, (run, report.problems)
        data = read_tree(s3.filesystem(), f"{s3server.BUCKET}/again{runs}/out", "data")
        first = first or data
        assert data and data == first, f"run {run + 1} wrote other data"
    assert sorted(work.iterdir()) == []


def _raypack(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`raypack ARGS` as a user types it, in `env` (its exit status left to the caller)."""
    return subprocess.run(
        [sys.executable, "-m", "raypack.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


def test_cli_on_s3_never_shows_the_secret(tmp_path: Path, tokenizer_path: Path, s3) -> None:
    """The whole CLI run, as a user would start it, with credentials in the environment: the secret
    must appear in no output stream and no file written (endpoint from AWS_ENDPOINT_URL this time)."""
    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "secret")
    data = yaml.safe_load(cfg_path.read_text())
    del data["storage"]
    cfg_path.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"AWS_ENDPOINT_URL": s3.endpoint}
    runs = [
        _raypack(args, env)
        for args in (
            ["pack", str(cfg_path)],
            ["verify", f"s3://{s3server.BUCKET}/secret/out", "--config", str(cfg_path)],
        )
    ]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert s3server.SECRET_KEY not in proc.stdout + proc.stderr
    assert runs[1].stdout.startswith("OK: ")
    # The endpoint given by --set alone (none in the environment): verify reads the manifest there,
    # then re-tokenizes its sample with the config the manifest records.
    plain = {k: v for k, v in env.items() if not k.startswith("AWS_ENDPOINT_URL")}
    out = f"s3://{s3server.BUCKET}/secret/out"
    said = []
    for extra in ([], ["--sample", "0"]):
        by_set = _raypack(["verify", out, "--set", f"storage.endpoint={s3.endpoint}", *extra], plain)
        assert by_set.returncode == 0 and by_set.stdout.startswith("OK: "), (
            by_set.stdout + by_set.stderr[-2000:]
        )
        said.append(by_set.stdout)
    assert "re-tokenized and equal" in said[0] and "re-tokenized" not in said[1]
    written = read_tree(s3.filesystem(), f"{s3server.BUCKET}/secret", "out")
    assert "manifest.json" in {Path(p).name for p in written}
    for path, content in written.items():
        assert s3server.SECRET_KEY.encode() not in content, path


def test_wrong_secret_is_a_one_line_config_error(tmp_path: Path, tokenizer_path: Path, s3, capsys) -> None:
    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "wrongkey")
    wrong = "not-the-" + s3server.SECRET_KEY
    old = os.environ["AWS_SECRET_ACCESS_KEY"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = wrong  # after other jobs of this process used the right one
    try:
        code = main(["pack", str(cfg_path)])
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = old
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "raypack: error:" in err
    assert "SIGNATURE" in err.upper() or "denied" in err.lower() or "forbidden" in err.lower()
    assert wrong not in err and s3server.SECRET_KEY not in err


def test_an_output_in_a_bucket_that_does_not_exist_fails_before_any_work(
    tmp_path: Path, tokenizer_path: Path, s3, capsys
) -> None:
    """The first write failed in a task, after tokenizing had begun: now one line, exit 2, at once."""
    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "nobucket")
    assert main(["pack", str(cfg_path), "--set", "output.path=s3://no-such-bucket/out"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "raypack: error: output s3://no-such-bucket/out: bucket 'no-such-bucket' does not exist; raypack "
        "writes into an existing bucket (create it first, e.g. `aws s3 mb s3://no-such-bucket`)\n"
    )
    assert "tokenize" not in captured.out + captured.err


def test_a_uri_with_one_slash_is_refused_not_taken_for_a_local_directory(
    tmp_path: Path, tokenizer_path: Path, capsys
) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=5)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, output={"path": "s3:/packed/x"})
    assert main(["pack", str(cfg)]) == 2
    assert (
        "s3:/packed/x is a local path that looks like a URI: did you mean s3://packed/x?"
        in capsys.readouterr().err
    )
    assert not (Path.cwd() / "s3:").exists()


def test_unreachable_endpoint_fails_fast(tmp_path: Path, tokenizer_path: Path, capsys) -> None:
    (port,) = s3server.free_ports(1)
    cfg_path = job_config(
        tmp_path,
        "s3://nowhere/corpus/*.jsonl",
        tokenizer_path,
        output={"path": str(tmp_path / "out")},
        storage={"endpoint": f"http://127.0.0.1:{port}", "max_attempts": 2, "connect_timeout": 1},
    )
    t0 = time.monotonic()
    code = main(["pack", str(cfg_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot list input s3://nowhere/corpus/*.jsonl" in err
    assert time.monotonic() - t0 < 30


def test_credentials_in_a_uri_are_refused_without_echoing_them() -> None:
    with pytest.raises(ConfigError) as e:
        expand_inputs(("s3://AKIAXXXX:hunter2secret@bucket/corpus/*.jsonl",))
    assert "hunter2secret" not in str(e.value) and "AWS_SECRET_ACCESS_KEY" in str(e.value)


def test_rebuild_on_s3_moves_latest_and_reuses_the_cache(tmp_path: Path, tokenizer_path: Path, s3) -> None:
    from raypack.dataset.layout import latest_version, list_versions
    from raypack.pipeline.rebuild import run_rebuild

    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "rebuild")
    cfg = load_config(str(cfg_path))
    first = run_rebuild(cfg, log=lambda _: None)
    # One shard changes in the bucket; the others must come from the cache.
    fs = s3.filesystem()
    with fs.open_output_stream(f"{s3server.BUCKET}/rebuild/corpus/part-003.jsonl") as f:
        f.write(json.dumps({"text": "a changed shard " * 40}).encode() + b"\n")
    second = run_rebuild(cfg, log=lambda _: None)
    assert (first.job.shards_tokenized, second.job.shards_reused, second.job.shards_tokenized) == (5, 4, 1)
    root = cfg.output.path
    assert list_versions(root, cfg.storage) == [1, 2] and latest_version(root, cfg.storage) == 2
    report = verify(root, cfg, sample=10)
    assert report.ok, report.problems
    assert report.dataset == f"{root}/v=000002" and report.documents == 4 * 30 + 1
    # Each version has its report; `raypack report ROOT` follows LATEST and makes the same page.
    page = f"{s3server.BUCKET}/rebuild/out/v=000002/report.html"
    assert second.job.report == f"{root}/v=000002/report.html"
    written = fs.open_input_stream(page).read()
    assert main(["report", root, "--config", str(cfg_path), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "report.html").read_bytes() == written and b"121 documents" in written
    cache = fs.get_file_info(pafs.FileSelector(f"{s3server.BUCKET}/rebuild/out/_cache/tokens"))
    assert sorted(i.base_name for i in cache) == sorted(f"{k}.arrow" for k in second.job.token_keys)


def test_a_star_stays_inside_one_directory_on_s3(s3) -> None:
    fs = s3.filesystem()
    for rel in ("a.parquet", "b.parquet", "packed/v=000001/data/part-000000.parquet", "holdout/c.parquet"):
        with fs.open_output_stream(f"{s3server.BUCKET}/globs/web/{rel}") as f:
            f.write(b"x")
    storage = load_config_storage(s3)
    found = expand_inputs((f"s3://{s3server.BUCKET}/globs/web/*.parquet",), storage=storage)
    assert [s.relpath for s in found] == ["a.parquet", "b.parquet"]
    found = expand_inputs((f"s3://{s3server.BUCKET}/globs/web/**/*.parquet",), storage=storage)
    assert [s.relpath for s in found] == [
        "a.parquet",
        "b.parquet",
        "holdout/c.parquet",
        "packed/v=000001/data/part-000000.parquet",
    ]


def load_config_storage(server: s3server.S3Server):  # type: ignore[no-untyped-def]
    from raypack.config import StorageConfig

    return StorageConfig(endpoint=server.endpoint)


@pytest.mark.slow  # 35 s; the light tier has two jobs filling one store at once (test_store)
def test_two_rebuilds_started_together_never_damage_each_other(
    tmp_path: Path, tokenizer_path: Path, s3
) -> None:
    """Started at once on one root: one builds, the other exits at once naming it (LeaseHeld);
    then one that waits (--wait) builds after it. LATEST only moves forward; every version verifies."""
    import threading

    from raypack.dataset.layout import latest_version, list_versions
    from raypack.dataset.lease import LeaseHeld
    from raypack.pipeline.rebuild import run_rebuild

    cfg = load_config(str(s3_config(tmp_path, s3, tokenizer_path, "together")))
    root, storage = cfg.output.path, cfg.storage
    outcomes: dict[str, object] = {}
    start = threading.Barrier(2)

    def rebuild(name: str, wait_s: float, together: bool = True) -> None:
        if together:
            start.wait()
        try:
            outcomes[name] = run_rebuild(cfg, wait_s=wait_s, log=lambda _: None).version
        except Exception as e:
            outcomes[name] = e

    threads = [threading.Thread(target=rebuild, args=(n, 0.0)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    won = [v for v in outcomes.values() if isinstance(v, str)]
    refused = [v for v in outcomes.values() if isinstance(v, LeaseHeld)]
    assert won == ["v=000001"] and len(refused) == 1, outcomes
    assert "is being rebuilt by" in str(refused[0]) and "--wait" in str(refused[0])
    assert list_versions(root, storage) == [1] and latest_version(root, storage) == 1

    # Now the second, started while the first holds the lease, waits for it instead of refusing: both
    # build, one after the other.
    outcomes.clear()
    lease = f"{s3server.BUCKET}/together/out/_lease.json"
    threads = [threading.Thread(target=rebuild, args=(n, w, False)) for n, w in (("c", 0.0), ("d", 300.0))]
    threads[0].start()
    deadline = time.monotonic() + 60
    while not s3.filesystem().get_file_info(lease).is_file and time.monotonic() < deadline:
        time.sleep(0.05)
    threads[1].start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(outcomes.values()) == ["v=000002", "v=000003"], outcomes  # type: ignore[type-var]
    assert list_versions(root, storage) == [1, 2, 3] and latest_version(root, storage) == 3
    for version in ("v=000002", "v=000003"):
        assert verify(f"{root}/{version}", cfg, sample=5).ok
    assert not s3.filesystem().get_file_info(lease).is_file


def test_an_azure_container_at_account_is_not_taken_for_credentials() -> None:
    """abfs://container@account is Azure's address, not a secret: refused as one, it blocked Azure."""
    from raypack.storage import resolve

    try:
        resolve("abfs://container@account.dfs.core.windows.net/corpus/a.jsonl")
    except ConfigError as e:  # this pyarrow may lack Azure, or the account be unreachable: not a secret
        assert "holds credentials" not in str(e)
    for secret in ("abfs://acct:s3cr3t@account.dfs.core.windows.net/x", "gs://user@bucket/x"):
        with pytest.raises(ConfigError, match="holds credentials") as e:
            resolve(secret)
        assert "s3cr3t" not in str(e.value)


@pytest.mark.ray  # a Ray Dataset: ray.data starts Ray in this process
def test_a_dataset_packed_to_s3_stages_its_rows_there_and_equals_a_local_pack(
    tmp_path: Path, tokenizer_path: Path, s3
) -> None:
    """A Ray Dataset's rows are staged under the output's staging area, here on the S3 server, and
    read back by the tokenize tasks from there: the data files equal the same Dataset packed to
    local disk, and no staged row is left in the bucket."""
    import ray

    import raypack

    cfg_path = s3_config(tmp_path, s3, tokenizer_path, "dataset")
    data = yaml.safe_load(cfg_path.read_text())
    del data["input"]["paths"]
    rows = [{"text": f"row {i} " + " ".join(["words"] * (i % 40 + 1)), "id": f"r{i}"} for i in range(400)]
    ds = ray.data.from_items(rows, override_num_blocks=6)
    data["input"]["id_field"] = "id"
    raypack.pack(data, dataset=ds, log=lambda _: None)
    local = {**data, "output": {**data["output"], "path": str(tmp_path / "o")}, "storage": {}}
    local["tokenizer"] = {**data["tokenizer"], "path": str(tokenizer_path)}
    raypack.pack(local, dataset=ds, log=lambda _: None)
    fs = s3.filesystem()
    remote = read_tree(fs, f"{s3server.BUCKET}/dataset/out", "data")
    assert remote and remote == read_tree(pafs.LocalFileSystem(), str(tmp_path / "o"), "data")
    # No staged file is left (SeaweedFS keeps a prefix's empty directory entries after its objects
    # are deleted; S3 has none to keep).
    left = fs.get_file_info(
        pafs.FileSelector(f"{s3server.BUCKET}/dataset/out/_staging", recursive=True, allow_not_found=True)
    )
    assert [i.path for i in left if i.type == pafs.FileType.File] == []
