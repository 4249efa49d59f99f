"""What input data cannot do: choose where output goes, or run code. (Credentials kept out of logs,
errors and every object written: tests/pipeline/test_s3.py greps all of them for the secret.)"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pyarrow.parquet as pq

from raypack.config import load_config
from raypack.pipeline.job import run_job
from tests.conftest import job_config, write_jsonl

PACKAGE = Path(__file__).resolve().parent.parent / "raypack"
# Modules and calls that turn bytes into code or arbitrary objects.
UNSAFE_MODULES = {"pickle", "cloudpickle", "marshal", "shelve", "dill", "joblib"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}
# The local pool's processes talk in pickles, as every process pool does (multiprocessing's and Ray's
# too, where it is not an import of theirs that shows): the driver's own task messages over a socket in
# a directory only its user may enter (0700), and the values its tasks pass on, in files its own
# workers wrote in such a directory. No byte of the input or the output is ever unpickled.
POOL_MODULES = {"pool.py", "zygote.py"}  # raypack/engine/: the local pool passes its tasks pickled


def test_the_package_never_unpickles_or_evaluates_anything() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [
                    f"{path.name}: import {n}"
                    for n in names
                    if n.split(".")[0] in UNSAFE_MODULES and not (n == "pickle" and path.name in POOL_MODULES)
                ]
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in UNSAFE_CALLS:
                    found.append(f"{path.name}:{node.lineno}: {func.id}()")
                yaml_load = isinstance(func, ast.Attribute) and func.attr in {"load", "unsafe_load"}
                if yaml_load and isinstance(func.value, ast.Name) and func.value.id == "yaml":
                    found.append(f"{path.name}:{node.lineno}: yaml.{func.attr}() (use safe_load)")
                for kw in node.keywords:  # np.load(..., allow_pickle=True) and the like
                    if kw.arg == "allow_pickle" and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value is False
                    ):
                        found.append(f"{path.name}:{node.lineno}: allow_pickle not False")
    assert found == []
    assert len(list(PACKAGE.rglob("*.py"))) > 20  # the walk saw the package


def test_ids_and_paths_from_the_input_never_name_output_files(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    hostile = [
        "../../../escaped",
        "/etc/passwd",
        "data/part-00000.parquet",
        "a\nb",
        "..",
        "manifest.json",
        "report.html",
    ]
    write_jsonl(corpus / "a.jsonl", [{"id": i, "text": f"text number {n}"} for n, i in enumerate(hostile)])
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"id_field": "id"})))
    run_job(cfg, log=lambda _: None)
    out = tmp_path / "out"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    outside = [w for w in written if not w.startswith(("out/", "corpus/")) and w != "job.yaml"]
    assert outside == []
    names = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()]
    generated = re.compile(
        r"(data/part-\d{5}|index/shard-\d{6})\.parquet|manifest\.json|metrics\.json|report\.html"
    )
    assert all(generated.fullmatch(n) for n in names), names
    ids = {i for row in pq.read_table(out / "data").column("doc_ids").to_pylist() for i in row}
    assert ids == set(hostile)  # kept as data, verbatim
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["path"] for f in manifest["files"]] == ["data/part-00000.parquet"]


def test_generated_ids_are_relative_to_the_input_root(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus" / "nested"
    corpus.mkdir(parents=True)
    write_jsonl(corpus / "a.jsonl", [{"text": "one"}, {"text": "two"}])
    cfg = load_config(str(job_config(tmp_path, f"{tmp_path}/corpus/**/*.jsonl", tokenizer_path)))
    run_job(cfg, log=lambda _: None)
    ids = sorted(pq.read_table(tmp_path / "out" / "index").column("doc_id").to_pylist())
    assert ids == ["nested/a.jsonl:1", "nested/a.jsonl:2"]  # never the machine's absolute path
