"""raypack used from Python (raypack.pack, raypack.verify, raypack.load_config) as a notebook or a
scheduler script uses it, on the default executor: each call a job of its own, whatever came before
it in the process; and what a job writes, nowhere but its output, its staging area and the temp dir."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import raypack
from raypack.errors import ConfigError
from tests import s3server
from tests.conftest import cli, job_config, make_corpus, packed_documents, s3_job_config, train_tokenizer


def quiet(_: str) -> None:
    pass


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file of a dataset but those holding times or the output's own path."""
    skip = {"metrics.json", "report.html", "manifest.json"}
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def test_the_public_api_is_what_all_lists() -> None:
    assert raypack.__all__ == ["__version__", "load_config", "pack", "verify"]
    # In a fresh interpreter (here, the tests have imported raypack's modules, its attributes too):
    names = "import raypack; print(sorted(n for n in dir(raypack) if not n.startswith('_')))"
    done = subprocess.run([sys.executable, "-c", names], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "['load_config', 'pack', 'verify']", done.stderr


def test_two_calls_in_one_process_write_what_two_commands_write(tmp_path: Path, tokenizer_path: Path) -> None:
    """The config given as a YAML path, as a mapping and as a loaded config: each call writes, byte for
    byte, what `raypack pack` writes in a process of its own."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=30, seed=3)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    mapping = yaml.safe_load(path.read_text())
    mapping["pack"]["seq_len"] = 256
    mapping["output"]["path"] = str(tmp_path / "api-2")
    first = raypack.pack(path, overrides=[f"output.path={tmp_path / 'api-1'}"], log=quiet)
    second = raypack.pack(mapping, log=quiet)
    third = raypack.pack(raypack.load_config(mapping), overwrite=True, log=quiet)
    assert [r.runner["name"] for r in (first, second, third)] == ["local"] * 3
    cli("pack", str(path), "--set", f"output.path={tmp_path / 'cli-1'}", "--quiet")
    cli(
        "pack",
        str(path),
        "--set",
        f"output.path={tmp_path / 'cli-2'}",
        "--set",
        "pack.seq_len=256",
        "--quiet",
    )
    for name in ("1", "2"):
        api, command = digests(tmp_path / f"api-{name}"), digests(tmp_path / f"cli-{name}")
        assert api == command and any(k.startswith("data/") for k in api)
    assert raypack.verify(str(tmp_path / "api-2"), mapping, sample=10).ok


@pytest.mark.parametrize("executor", ["auto", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def test_a_second_job_packs_with_the_tokenizer_saved_since_the_first(tmp_path: Path, executor: str) -> None:
    """A notebook: train a tokenizer, save it, pack; train another, save it at the same path, pack
    again. The second job's documents carry the second tokenizer's ids, every one of them (they all
    carried the first's, 641 of 641, while its manifest named the second), on the local pool as on a
    Ray whose worker processes served the first job."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=30, seed=5)
    tok = tmp_path / "tok" / "tokenizer.json"
    path = job_config(tmp_path, f"{corpus}/*", tok, run={"executor": executor})
    found = []
    for name, vocab, seed in (("first", 300, 1), ("second", 420, 2)):
        train_tokenizer(tok, vocab, seed)
        result = raypack.pack(path, overrides=[f"output.path={tmp_path / name}"], log=quiet)
        assert result.runner["name"] == ("local" if executor == "auto" else "ray")
        from tests.conftest import independent_tokens

        want = independent_tokens(corpus, tok)
        got = packed_documents(tmp_path / name)
        assert got == want, f"{sum(got[d] != want[d] for d in want)} of {len(want)} documents differ"
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert manifest["tokenizer"]["sha256"] == hashlib.sha256(tok.read_bytes()).hexdigest()
        assert raypack.verify(str(tmp_path / name), raypack.load_config(path), sample=90).ok
        found.append(got)
    assert found[0] != found[1]


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `roots` (each root itself included), with size and mtime."""
    seen: dict[str, tuple[int, int]] = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames, ""]:
                p = Path(dirpath, name) if name else Path(dirpath)
                st = p.lstat()
                seen[str(p)] = (st.st_size if not p.is_dir() else 0, st.st_mtime_ns)
    return seen


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_job_writes_nothing_outside_its_output_its_staging_area_and_the_temp_dir(
    tmp_path: Path, tokenizer_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """`raypack pack` run from a working directory of its own, with a temp dir of its own: the working
    directory, the inputs, the tokenizer's directory and the user's raypack caches are as they were;
    the temp dir holds nothing once the command is done; on S3, the bucket holds nothing new outside
    the output (a URI output once put the exchange's files under ./s3:/... of the working dir)."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=40, seed=8)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    work, temp = tmp_path / "work", tmp_path / "temp"
    work.mkdir()
    temp.mkdir()
    if where == "s3":
        server = request.getfixturevalue("s3")
        path = s3_job_config(tmp_path, server, corpus, tok_dir / "tokenizer.json", "outside")
        fs = server.filesystem()
        from pyarrow.fs import FileSelector

        before_bucket = {i.path for i in fs.get_file_info(FileSelector(s3server.BUCKET, recursive=True))}
    else:
        path = job_config(tmp_path, f"{corpus}/*", tok_dir / "tokenizer.json")
    home_caches = Path.home() / ".cache" / "raypack"
    before = _snapshot(work, corpus, tok_dir, home_caches)
    cli("pack", str(path), "--quiet", cwd=work, env={"TMPDIR": str(temp)})
    assert _snapshot(work, corpus, tok_dir, home_caches) == before
    assert sorted(temp.iterdir()) == []
    if where == "s3":
        after_bucket = {i.path for i in fs.get_file_info(FileSelector(s3server.BUCKET, recursive=True))}
        new = sorted(
            p for p in after_bucket - before_bucket if not p.startswith(f"{s3server.BUCKET}/outside/out")
        )
        assert new == []
        assert f"{s3server.BUCKET}/outside/out/manifest.json" in after_bucket
    else:
        out = tmp_path / "out"
        assert (out / "manifest.json").is_file() and not (out / "_staging").exists()


def test_config_mistakes_from_python_are_one_line_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found"):
        raypack.pack(tmp_path / "missing.yaml", log=quiet)
    with pytest.raises(ConfigError, match=r"unknown key.*paks|paks"):
        raypack.load_config({"input": {"paths": ["x"]}, "tokenizer": {"path": "t"}, "paks": {}})
    cfg = raypack.load_config(
        {"input": {"paths": ["x"]}, "tokenizer": {"path": "t"}, "output": {"path": "o"}}
    )
    assert raypack.load_config(cfg) is cfg
    assert raypack.load_config(cfg, ["pack.seq_len=64"]).pack.seq_len == 64
    assert raypack.load_config(cfg, "pack.seq_len=64").pack.seq_len == 64  # one override, not its letters
    with pytest.raises(
        ConfigError, match="a YAML file's path, a mapping of its sections or a JobConfig, not int"
    ):
        raypack.load_config(42)  # type: ignore[arg-type]
