"""Output formats (raypack.formats), each read by the client its trainers use: megatron-core's
IndexedDataset and GPTDataset (through BlendedMegatronDatasetBuilder, on CPU), OLMo-core's
NumpyFSLDataset, MosaicML streaming's LocalDataset / StreamingDataset / MDSWriter (in an environment
of its own, .venv-mds); and raypack's own verify, reader and convert on every format."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from raypack import schema
from raypack.cli import main
from raypack.config import JobConfig, load_config
from raypack.convert import convert, target_spec
from raypack.errors import ConfigError
from raypack.formats import FORMATS, Packs, Spec, read_packs, spec_of
from raypack.formats.files import write_packs
from raypack.formats.mds import decode_shard
from raypack.formats.megatron import DATA_ARGS, parse_index
from raypack.pipeline.job import run_job
from raypack.pipeline.rebuild import run_rebuild
from raypack.reader import IGNORE_INDEX, batch_fields, iter_batches, read_packed
from raypack.verifier import verify
from tests import s3server
from tests.conftest import make_corpus, s3_job_config

ROOT = Path(__file__).resolve().parents[2]
SEQ = 512
VOCAB = 512  # the session tokenizer's
EOS, PAD = 0, 2  # <|endoftext|>, and the pad the jobs here write (<|pad|>)
quiet = {"log": lambda _: None}


def job(tmp: Path, corpus: Path, tok: Path, out: Path, fmt: str, **sections: dict[str, Any]) -> JobConfig:
    data: dict[str, Any] = {
        "input": {"paths": [f"{corpus}/*"], "group_bytes": 0},  # a file a unit (conftest.job_config)
        "tokenizer": {"path": str(tok), "concurrency": 1},
        "pack": {"seq_len": SEQ},
        "output": {"path": str(out), "shard_rows": 20, "pad_id": PAD, "format": fmt},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    path = tmp / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Any]:
    """One corpus packed in every format, one tokenizer actor each; and the configs."""
    tmp = tmp_path_factory.mktemp("formats")
    corpus = make_corpus(tmp, shards=4, docs_per_shard=40, seed=3)
    outs, cfgs = {}, {}
    for fmt in FORMATS:
        cfgs[fmt] = job(tmp, corpus, tokenizer_path, tmp / f"out-{fmt}", fmt)
        run_job(cfgs[fmt], **quiet)
        outs[fmt] = tmp / f"out-{fmt}"
    return {"tmp": tmp, "corpus": corpus, "out": outs, "cfg": cfgs}


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def all_packs(out: Path) -> list[Packs]:
    m = manifest(out)
    return [read_packs(str(out), f, spec_of(m), None) for f in sorted(m["files"], key=lambda f: f["path"])]


def stacked(out: Path) -> tuple[np.ndarray, pa.Table]:
    """Every pack's tokens (file order) and the pack index."""
    packs = all_packs(out)
    return np.concatenate([p.input_ids for p in packs]), pa.concat_tables(p.index for p in packs)


def fields(out: Path) -> dict[str, np.ndarray]:
    """raypack's reader fields for every pack, in file order."""
    tokens, index = stacked(out)
    table = index.add_column(0, "input_ids", pa.array(list(tokens), pa.list_(pa.int32())))
    return batch_fields(table, SEQ, spec_of(manifest(out)).pad_id)


def tree(out: Path, *parts: str) -> dict[str, bytes]:
    found = {}
    for part in parts:
        base = out / part
        paths = sorted(base.rglob("*")) if base.is_dir() else ([base] if base.exists() else [])
        found.update({str(p.relative_to(out)): p.read_bytes() for p in paths if p.is_file()})
    return found


FORMAT_FILES = ("data", "packs", "label_mask", "index")


def test_every_format_holds_the_same_packs_and_verifies(packed: dict[str, Any]) -> None:
    """The packs do not depend on the format: tokens, documents and offsets equal parquet's, padding
    as the format's Spec says (megatron: EOS); verify re-reads every format and re-tokenizes a sample."""
    ref_tokens, ref_index = stacked(packed["out"]["parquet"])
    real = np.arange(SEQ)[None, :] < ref_index.column("num_tokens").to_numpy()[:, None]
    for fmt in FORMATS:
        out = packed["out"][fmt]
        spec = spec_of(manifest(out))
        tokens, index = stacked(out)
        assert index.equals(ref_index), fmt
        assert np.array_equal(tokens[real], ref_tokens[real]), fmt
        assert spec.pad_id == (EOS if fmt == "megatron" else PAD) and np.all(tokens[~real] == spec.pad_id)
        report = verify(str(out), packed["cfg"][fmt], sample=16)
        assert report.ok, (fmt, report.problems)
        assert report.format == fmt and report.sampled == 16 and report.documents == 160
    assert spec_of(manifest(packed["out"]["olmo"])).dtype == "uint16"  # 512 ids: vocab_size - 1 > 255
    assert spec_of(manifest(packed["out"]["megatron"])).dtype == "uint16"


def test_the_reader_gives_the_same_batches_in_every_format(packed: dict[str, Any]) -> None:
    want = list(iter_batches(str(packed["out"]["parquet"]), batch_size=4, rank=1, world_size=2, seed=7))
    assert len(want) > 3
    for fmt in ("megatron", "olmo", "mds", "trl", "bridge"):
        got = list(iter_batches(str(packed["out"][fmt]), batch_size=4, rank=1, world_size=2, seed=7))
        assert len(got) == len(want), fmt
        for a, b in zip(got, want, strict=True):
            for key in ("labels", "shift_labels", "position_ids", "document_ids", "cu_seqlens"):
                assert np.array_equal(a[key], b[key]), (fmt, key)
            real = b["document_ids"] >= 0
            assert np.array_equal(a["input_ids"][real], b["input_ids"][real]), fmt


@pytest.mark.ray
def test_ray_data_reads_an_mds_dataset_pack_for_pack(packed: dict[str, Any]) -> None:
    rows = read_packed(str(packed["out"]["mds"])).take_all()
    assert sorted(list(r["doc_offsets"]) for r in rows) == sorted(
        o for o in stacked(packed["out"]["parquet"])[1].column("doc_offsets").to_pylist()
    )


def megatron_config(blend: tuple[list[str], list[float] | None], extra_token: bool) -> Any:
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    class Tokenizer:  # what GPTDataset asks of a tokenizer; pad unset, as Megatron's default
        eod = EOS
        pad = -1
        vocab_size = VOCAB
        unique_identifiers: ClassVar[dict[str, str]] = {"class": "raypack-test"}

    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQ,
        blend=blend,
        split="100,0,0",
        tokenizer=Tokenizer(),
        reset_position_ids=True,
        reset_attention_mask=True,
        eod_mask_loss=True,
        add_extra_token_to_sequence=extra_token,
    )


def test_megatron_reads_the_packs_as_packs(packed: dict[str, Any], tmp_path: Path) -> None:
    """IndexedDataset reads every pair (each byte as megatron-core's own builder writes it); GPTDataset,
    built from the data-args file with the settings docs/output-format.md gives, yields exactly the
    packs, its loss mask and position ids those of raypack's reader; without
    add_extra_token_to_sequence=False its samples straddle packs."""
    warnings.filterwarnings("ignore", module="megatron")
    torch = pytest.importorskip("torch")
    megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    out = packed["out"]["megatron"]
    m = manifest(out)
    packs = {
        f["path"]: p for f, p in zip(sorted(m["files"], key=lambda f: f["path"]), all_packs(out), strict=True)
    }
    for path, p in packs.items():
        prefix = str(out / path[: -len(".bin")])
        ds = megatron.IndexedDataset(prefix)
        assert len(ds) == p.rows and ds.index.dtype == np.uint16
        assert np.array_equal(np.stack([np.array(ds[i]) for i in range(len(ds))]), p.input_ids)
        assert np.array_equal(ds.document_indices, np.arange(p.rows + 1))
        del ds  # it unmaps its buffers
        theirs = tmp_path / Path(path).stem
        builder = megatron.IndexedDatasetBuilder(f"{theirs}.bin", dtype=np.uint16)
        for row in p.input_ids:
            builder.add_item(torch.from_numpy(row.astype(np.int64)))
            builder.end_document()
        builder.finalize(f"{theirs}.idx")
        assert Path(f"{theirs}.bin").read_bytes() == (out / path).read_bytes()
        assert Path(f"{theirs}.idx").read_bytes() == (out / path).with_suffix(".idx").read_bytes()

    args = (out / DATA_ARGS).read_text().split()
    weights, prefixes = [float(w) for w in args[0::2]], args[1::2]
    assert prefixes == [str(out / p[: -len(".bin")]) for p in sorted(packs)]
    assert weights == [f["rows"] * SEQ for f in sorted(m["files"], key=lambda f: f["path"])]
    # Megatron's blend caches its indexes beside the prefixes (a path_to_cache needs torch.distributed),
    # so it reads a copy: the prefixes then given by hand, as for a moved dataset.
    copy = tmp_path / "copy"
    shutil.copytree(out / "data", copy / "data")
    prefixes = [p.replace(str(out), str(copy)) for p in prefixes]
    n = m["counts"]["packs"]
    config = megatron_config((prefixes, weights), extra_token=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, 0, 0], lambda: True, config).build()
    samples = [train[i] for i in range(len(train))]

    mine = fields(packed["out"]["parquet"])
    by_tokens = {tuple(row.tolist()): i for i, row in enumerate(stacked(out)[0])}
    assert len(samples) == n
    seen = sorted(by_tokens[tuple(s["tokens"].tolist())] for s in samples)
    assert seen == list(range(n))  # every pack exactly once, as a multiset
    for s in samples:
        i = by_tokens[tuple(s["tokens"].tolist())]
        real = mine["document_ids"][i] >= 0
        assert np.array_equal(s["loss_mask"].numpy() == 1, mine["shift_labels"][i] != IGNORE_INDEX)
        assert not s["loss_mask"].numpy()[~real].any()  # padding never trained
        assert np.array_equal(s["position_ids"].numpy()[real], mine["position_ids"][i][real])
        labels = s["labels"].numpy()
        trained = s["loss_mask"].numpy() == 1
        assert np.array_equal(labels[trained], mine["shift_labels"][i][trained])

    # Megatron's default (an extra token a sample) reads SEQ + 1 tokens from each sample's start: its
    # tokens are a pack, but its last label is the first token of the pack read after it, trained
    # wherever the pack does not end in EOD (a chunk of a long document). (An epoch also holds a
    # sample fewer than packs: half as many are asked for, within one epoch.)
    config = megatron_config((prefixes, weights), extra_token=True)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n // 2, 0, 0], lambda: True, config).build()
    extra = [train[i] for i in range(len(train))]
    assert all(tuple(s["tokens"].tolist()) in by_tokens for s in extra)
    firsts = {row[0] for row in by_tokens}
    across = [s for s in extra if s["loss_mask"][-1] == 1]
    assert across and all(int(s["labels"][-1]) in firsts and int(s["tokens"][-1]) != EOS for s in across)


def test_olmo_core_reads_the_packs_pack_for_pack(packed: dict[str, Any]) -> None:
    """NumpyFSLDataset's instance i of a file is its pack i; generate_doc_lengths gives the pack's
    documents (and its padding as a last one); its labels from the label masks are raypack's
    shift_labels; the .csv.gz document bounds are the items'."""
    olmo = pytest.importorskip("olmo_core.data")
    from olmo_core.data.utils import get_labels, iter_document_indices

    out = packed["out"]["olmo"]
    m = manifest(out)
    files = sorted(m["files"], key=lambda f: f["path"])
    paths = [str(out / f["path"]) for f in files]
    masks = [str(out / "label_mask" / Path(f["path"]).name) for f in files]
    ds = olmo.NumpyFSLDataset(
        *paths,
        sequence_length=SEQ,
        pad_token_id=PAD,
        eos_token_id=EOS,
        vocab_size=VOCAB,
        dtype=np.uint16,
        generate_doc_lengths=True,
        label_mask_paths=masks,
    )
    ds.work_dir = str(packed["tmp"] / "olmo-work")
    tokens, index = stacked(out)
    mine = fields(packed["out"]["parquet"])
    assert len(ds) == len(tokens) == m["counts"]["packs"]
    offsets, num_tokens = index.column("doc_offsets").to_pylist(), index.column("num_tokens").to_pylist()
    for i in range(len(ds)):
        item = ds[i]
        assert np.array_equal(item["input_ids"].numpy(), tokens[i])
        lengths = np.diff(offsets[i]).tolist() + ([SEQ - num_tokens[i]] if num_tokens[i] < SEQ else [])
        assert item["doc_lens"].tolist() == lengths
        labels = get_labels({k: v[None] for k, v in item.items() if k in ("input_ids", "label_mask")})
        assert np.array_equal(labels[0].numpy(), mine["shift_labels"][i])
    first = all_packs(out)[0]
    starts, ends = first.item_bounds()
    bounds = list(iter_document_indices(paths[0], use_array_if_local=False))
    assert bounds == list(zip(starts.tolist(), ends.tolist(), strict=True))
    with pytest.raises(ValueError):
        np.load(paths[0])  # headerless, as OLMo-core's token files are


def mds_python() -> Path | None:
    python = ROOT / ".venv-mds" / "bin" / "python"
    return python if python.exists() else None


def test_mosaicml_streaming_reads_the_mds_output(packed: dict[str, Any], tmp_path: Path) -> None:
    python = mds_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have .venv-mds (make test builds it) for the MosaicML streaming test")
        pytest.skip("no .venv-mds: `make .venv-mds/bin/python` builds MosaicML streaming's environment")
    out = packed["out"]["mds"]
    saved = tmp_path / "mds.npz"
    subprocess.run([str(python), str(ROOT / "tests/clients/mds_client.py"), str(out), str(saved)], check=True)
    got = np.load(saved)
    tokens, index = stacked(out)
    assert got["same_bytes"].tolist() == [True] * len(manifest(out)["files"])  # MDSWriter's bytes
    assert np.array_equal(got["data/tokens"], tokens)
    assert got["data/num_tokens"].tolist() == index.column("num_tokens").to_pylist()
    counts = got["data/doc_counts"].tolist()
    flat = got["data/doc_offsets"].tolist()
    cuts = np.r_[0, np.cumsum(counts)].tolist()
    assert [flat[a:b] for a, b in itertools.pairwise(cuts)] == index.column("doc_offsets").to_pylist()


@pytest.mark.slow  # 13 s; the bytes whatever the workers are test_job's in the light tier
def test_each_format_is_byte_identical_for_two_actors_and_across_a_rebuild(
    packed: dict[str, Any], tmp_path: Path
) -> None:
    for fmt in ("megatron", "olmo", "mds"):
        cfg = packed["cfg"][fmt]
        root = tmp_path / f"root-{fmt}"
        two = dataclasses.replace(
            cfg,
            tokenizer=dataclasses.replace(cfg.tokenizer, concurrency=2),
            output=dataclasses.replace(cfg.output, path=str(root)),
        )
        result = run_rebuild(two, **quiet)
        rebuilt, fresh = root / result.version, packed["out"][fmt]
        assert tree(rebuilt, *FORMAT_FILES) == tree(fresh, *FORMAT_FILES), fmt
        assert manifest(rebuilt)["files"] == manifest(fresh)["files"]
        if fmt == "megatron":  # the same pairs, each named where its dataset lies
            args = (rebuilt / DATA_ARGS).read_text().replace(str(rebuilt), "X")
            assert args == (fresh / DATA_ARGS).read_text().replace(str(fresh), "X")
        assert verify(str(root), sample=0).ok


@pytest.mark.slow  # 12 s; test_a_plain_dataset_written_as_trl_converts... keeps convert in the light tier
def test_convert_writes_what_pack_writes(packed: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    """parquet -> each format gives the bytes `raypack pack` wrote in it; mds -> parquet gives back
    the parquet files; every conversion verifies and names its source."""
    source = packed["out"]["parquet"]
    for fmt in ("megatron", "olmo", "mds"):
        out = tmp_path / f"conv-{fmt}"
        result = convert(str(source), fmt, str(out), **quiet)
        assert result.files == len(manifest(source)["files"])
        assert tree(out, *FORMAT_FILES) == tree(packed["out"][fmt], *FORMAT_FILES), fmt
        assert manifest(out)["converted_from"]["format"] == "parquet"
        assert manifest(out)["counts"] == manifest(packed["out"][fmt])["counts"]
        assert verify(str(out), packed["cfg"][fmt], sample=8).ok
    back = tmp_path / "back"
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "conv-mds"), "--format", "parquet", "--out", str(back)]) == 0
    assert tree(back, "data", "index") == tree(source, "data", "index")
    # A small dataset converts on this machine's processes: no Ray started for it (6.9 s it took).
    assert "tasks on local processes" in capsys.readouterr().err
    assert not ("ray" in sys.modules and sys.modules["ray"].is_initialized())
    # A dataset is not written over, nor into itself, and a format that cannot hold it is refused.
    assert main(["convert", str(source), "--format", "olmo", "--out", str(back)]) == 2
    assert main(["convert", str(source), "--format", "olmo", "--out", str(source / "x")]) == 2
    assert main(["convert", str(source), "--format", "tfrecord", "--out", str(tmp_path / "t")]) == 2
    assert "output.format must be one of parquet, megatron, olmo, mds" in capsys.readouterr().err


def test_a_plain_dataset_written_as_trl_converts_to_every_format_as_pack_writes_it(
    packed: dict[str, Any], tmp_path: Path
) -> None:
    """Whether a conversion keeps a mask is the dataset's kind (chat or plain text), decided as the
    job decides it, not whether its current format stores one: plain text packed as trl (which
    always writes labels) converts to megatron, olmo and mds, and back to parquet without a
    loss_mask column: each the bytes `raypack pack` writes in that format."""
    source = packed["out"]["trl"]
    for fmt in ("megatron", "olmo", "mds", "parquet", "bridge"):
        out = tmp_path / f"from-trl-{fmt}"
        convert(str(source), fmt, str(out), **quiet)
        assert tree(out, *FORMAT_FILES) == tree(packed["out"][fmt], *FORMAT_FILES), fmt
        spec = {k: v for k, v in manifest(out)["format"].items() if k != "files"}  # megatron's name paths
        assert spec == {k: v for k, v in manifest(packed["out"][fmt])["format"].items() if k != "files"}, fmt
        assert verify(str(out), packed["cfg"][fmt], sample=8).ok
    plain = pq.read_schema(tmp_path / "from-trl-parquet" / "data" / "part-00000.parquet")
    assert "loss_mask" not in plain.names


def test_convert_pads_with_the_id_it_is_given_and_refuses_settings_it_does_not_read(
    packed: dict[str, Any], tmp_path: Path, capsys: Any
) -> None:
    """A dataset padded with EOS (a tokenizer without a pad token) cannot go to olmo as it is: the
    refusal names convert's --pad-id, which re-pads every pack; a format whose trainer fixes its
    pad refuses another; and convert's --set takes only the sections it reads."""
    source = packed["out"]["parquet"]
    eos = int(manifest(source)["tokenizer"]["eos_id"])
    padded_with_eos = {**manifest(source), "tokenizer": {**manifest(source)["tokenizer"], "pad_id": eos}}
    with pytest.raises(ConfigError, match="--pad-id"):
        target_spec(padded_with_eos, "olmo")
    assert target_spec(padded_with_eos, "olmo", pad_id=2).pad_id == 2
    with pytest.raises(ConfigError, match=f"format megatron pads with id {eos}"):
        target_spec(padded_with_eos, "megatron", pad_id=2)
    max_id = int(manifest(source)["tokenizer"]["max_id"])
    for bad in (-1, max_id + 1):
        with pytest.raises(ConfigError, match=f"no id of the dataset's tokenizer \\(0..{max_id}\\)"):
            target_spec(padded_with_eos, "olmo", pad_id=bad)

    out = tmp_path / "repadded"
    capsys.readouterr()
    assert main(["convert", str(source), "--format", "parquet", "--out", str(out), "--pad-id", "7"]) == 0
    tokens, index = stacked(out)
    before, _ = stacked(source)
    real = np.arange(tokens.shape[1])[None, :] < index.column("num_tokens").to_numpy()[:, None]
    assert (~real).any() and (tokens[~real] == 7).all() and np.array_equal(tokens[real], before[real])
    assert manifest(out)["format"]["pad_id"] == 7 and manifest(out)["tokenizer"]["pad_id"] == 7
    # Given the pad it pads with anyway, a conversion's config says what the source's did.
    same = tmp_path / "same-pad"
    pad = int(manifest(source)["format"]["pad_id"])
    command = ["convert", str(source), "--format", "parquet", "--out", str(same), "--pad-id", str(pad)]
    assert main(command) == 0
    assert manifest(same)["config"]["output"] == {**manifest(source)["config"]["output"], "path": str(same)}
    was = packed["cfg"]["parquet"]
    assert verify(str(same), was, sample=8).ok
    # Verified with the config it was packed with, or with the pad it was converted to; not another.
    assert verify(str(out), was, sample=8).ok
    assert verify(str(out), dataclasses.replace(was, output=dataclasses.replace(was.output, pad_id=7))).ok
    other = verify(str(out), dataclasses.replace(was, output=dataclasses.replace(was.output, pad_id=9)))
    assert not other.ok and any("output.pad_id" in p for p in other.problems)

    cfg = tmp_path / "storage.yaml"
    cfg.write_text(yaml.safe_dump(packed["cfg"]["parquet"].to_dict()))
    capsys.readouterr()
    for command in (
        ["convert", str(source), "--format", "mds", "--out", str(tmp_path / "x")],
        ["report", str(source)],
    ):
        assert main([*command, "--config", str(cfg), "--set", "output.shard_rows=5"]) == 2
        err = capsys.readouterr().err
        assert "--set output.shard_rows=5: raypack " in err and "reads only the config's storage.*" in err
    assert not (tmp_path / "x").exists()


def test_a_converted_dataset_verifies_with_the_job_config_it_was_packed_with(
    packed: dict[str, Any], tmp_path: Path, capsys: Any
) -> None:
    """`raypack verify OUT --config job.yaml` after `raypack convert`: the job config still says the
    format (and pad) the data was packed with, and the dataset is right; so is a conversion of a
    conversion. Another format than either is still named."""
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(yaml.safe_dump(packed["cfg"]["parquet"].to_dict()))
    source = packed["out"]["parquet"]
    megatron, olmo, again = tmp_path / "megatron", tmp_path / "olmo", tmp_path / "again"
    assert main(["convert", str(source), "--format", "megatron", "--out", str(megatron)]) == 0
    assert main(["convert", str(source), "--format", "olmo", "--out", str(olmo), "--pad-id", "3"]) == 0
    assert main(["convert", str(olmo), "--format", "mds", "--out", str(again)]) == 0
    capsys.readouterr()
    for out in (megatron, olmo, again):
        assert main(["verify", str(out), "--config", str(job_yaml), "--sample", "8"]) == 0, out
        assert "8 documents re-tokenized and equal" in capsys.readouterr().out
    assert main(["verify", str(megatron), "--config", str(job_yaml), "--set", "output.format=olmo"]) == 1
    assert "output.format: the dataset was packed with 'megatron', the config says 'olmo'" in (
        capsys.readouterr().out
    )


def test_configs_a_trainer_cannot_read_right_are_refused_before_any_work(
    packed: dict[str, Any], tmp_path: Path, capsys: Any
) -> None:
    corpus, tok = packed["corpus"], Path(packed["cfg"]["parquet"].tokenizer.path)
    cases = [
        ("megatron", {"pack": {"algorithm": "bucket"}}, "several lengths"),
        ("olmo", {"pack": {"algorithm": "bucket"}}, "several lengths"),
        ("olmo", {"pack": {"algorithm": "decompose", "seq_len": 256}}, "bucket or decompose"),
        ("megatron", {"tokenizer": {"add_eos": False}}, "add_eos"),
        ("olmo", {"tokenizer": {"add_eos": False}}, "add_eos"),
        # Padding of EOS (a tokenizer without a pad token: Mistral's, tekken) would read as one-token
        # documents in OLMo-core (the combination test found it with the real tokenizers).
        ("olmo", {"output": {"pad_id": Tokenizer.from_file(str(tok)).token_to_id("<|endoftext|>")}}, "EOS"),
        ("mds", {"output": {"shard_rows": 2_000_000}}, "4 GiB"),
    ]
    for fmt, sections, words in cases:
        out = tmp_path / f"refused-{fmt}"
        with pytest.raises(ConfigError, match=words):
            run_job(job(tmp_path, corpus, tok, out, fmt, **sections), **quiet)
        assert not out.exists()
    with pytest.raises(ConfigError, match=r"output\.format must be one of"):
        job(tmp_path, corpus, tok, tmp_path / "x", "tfrecord")
    # convert refuses what the job refuses: packs of several lengths to megatron.
    bucketed = {
        **manifest(packed["out"]["parquet"]),
        "files": [{"bucket_length": 256}, {"bucket_length": 512}],
    }
    with pytest.raises(ConfigError, match="several lengths"):
        target_spec(bucketed, "megatron")
    assert main(["pack", str(tmp_path / "refused-megatron.yaml")]) == 2  # the add_eos: false case
    assert "output.format megatron" in capsys.readouterr().err


def test_sharded_mode_and_bucket_packs_in_formats_that_take_them(
    packed: dict[str, Any], tmp_path: Path
) -> None:
    corpus, tok = packed["corpus"], Path(packed["cfg"]["parquet"].tokenizer.path)
    sharded = job(tmp_path, corpus, tok, tmp_path / "sharded", "megatron", pack={"mode": "sharded"})
    run_job(sharded, **quiet)
    names = sorted(p.name for p in (tmp_path / "sharded" / "data").iterdir())
    assert "part-00000-00000.bin" in names and "part-00003-00000.idx" in names
    assert verify(str(tmp_path / "sharded"), sharded, sample=8).ok
    bucket = job(tmp_path, corpus, tok, tmp_path / "bucket", "mds", pack={"algorithm": "bucket"})
    run_job(bucket, **quiet)
    indexes = sorted(p.parent.name for p in (tmp_path / "bucket" / "data").rglob("index.json"))
    assert len(indexes) > 1 and set(indexes) <= {f"bucket={n}" for n in (64, 128, 256, 512)}
    for index in (tmp_path / "bucket" / "data").rglob("index.json"):
        length = int(index.parent.name.split("=")[1])
        shards = json.loads(index.read_text())["shards"]
        for shard in shards:
            samples = decode_shard((index.parent / shard["raw_data"]["basename"]).read_bytes())
            assert len(samples) == shard["samples"] and all(len(s["tokens"]) == length for s in samples)
    assert verify(str(tmp_path / "bucket"), bucket, sample=8).ok


def test_olmo_on_s3_writes_files_as_given_and_reads_back(
    packed: dict[str, Any], tmp_path: Path, tokenizer_path: Path, s3: s3server.S3Server
) -> None:
    """On object storage too: the .csv.gz is gzipped once (pyarrow would gzip a `.gz` name again),
    verify and the reader read every file through the format."""
    cfg_path = s3_job_config(
        tmp_path,
        s3,
        packed["corpus"],
        tokenizer_path,
        "formats",
        tokenizer={"concurrency": 1},
        pack={"seq_len": SEQ},
        output={"format": "olmo", "shard_rows": 20, "pad_id": PAD},
    )
    cfg = load_config(str(cfg_path))
    run_job(cfg, **quiet)
    fs = s3.filesystem()
    root = f"{s3server.BUCKET}/formats/out"
    with fs.open_input_stream(f"{root}/data/part-00000.csv.gz", compression=None) as f:
        text = gzip.decompress(f.read()).decode()
    assert text.splitlines()[0].startswith("0,")
    local = packed["out"]["olmo"]
    with fs.open_input_stream(f"{root}/data/part-00000.npy", compression=None) as f:
        assert f.read() == (local / "data/part-00000.npy").read_bytes()
    assert verify(cfg.output.path, cfg, sample=8).ok
    remote = list(iter_batches(cfg.output.path, batch_size=8, seed=3, storage=cfg.storage))
    here = list(iter_batches(str(local), batch_size=8, seed=3))
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(remote, here, strict=True))


def packs_of(tokens: list[list[list[int]]], capacity: int, pad: int = PAD) -> Packs:
    """Packs of the given items: a pack a list of items, an item a list of tokens."""
    ids = np.full((len(tokens), capacity), pad, dtype=np.int32)
    offsets, names = [], []
    for p, items in enumerate(tokens):
        flat = [t for item in items for t in item]
        ids[p, : len(flat)] = flat
        offsets.append(np.r_[0, np.cumsum([len(i) for i in items])].tolist())
        names.append([f"d{p}-{k}" for k in range(len(items))])
    index = pa.table(
        {
            "doc_offsets": pa.array(offsets, pa.list_(pa.int32())),
            "doc_ids": pa.array(names, pa.list_(pa.string())),
            "chunk_index": pa.array([[0] * len(n) for n in names], pa.list_(pa.int32())),
            "num_tokens": pa.array([o[-1] for o in offsets], pa.int32()),
        }
    )
    return Packs("part-00000", ids, index)


def test_eos_inside_a_document_is_counted_and_broken_files_are_named(tmp_path: Path) -> None:
    """A document whose text holds EOS is cut there by Megatron and OLMo-core: counted per file.
    Each format's own structure check names a file that is not what its pack index says."""
    specs = {
        "parquet": (Spec("parquet", PAD, "int32", EOS), 0),
        "megatron": (Spec("megatron", EOS, "uint16", EOS), 1),  # pads with EOS
        "olmo": (Spec("olmo", PAD, "uint16", EOS), 1),
        "mds": (Spec("mds", PAD, "int32", EOS), 0),  # its readers do not look for EOS
    }
    items = [[[5, EOS, 6, EOS], [7, EOS]], [[8, 9, EOS]]]  # document d0-0 holds an EOS at its 2nd token
    other = packs_of([[[5, EOS, 6, EOS, 7, EOS]], [[8, 9, EOS]], [[1, EOS]]], capacity=8)  # not those packs
    for name, (spec, stray) in specs.items():
        packs = packs_of(items, capacity=8, pad=spec.pad_id)
        row = write_packs(packs, str(tmp_path / name), spec).to_pylist()[0]
        assert row["stray_eos"] == stray, name
        paths = [row["path"], *(c["path"] for c in row["companions"] if not c["path"].startswith("packs/"))]
        own = {p: (tmp_path / name / p).read_bytes() for p in paths}
        assert FORMATS[name].check_file(own, packs, spec) == [], name
        if name != "parquet":  # parquet's data file is its own pack index: nothing to disagree with
            assert FORMATS[name].check_file(own, other, spec), name
    idx = (tmp_path / "megatron/data/part-00000.idx").read_bytes()
    assert parse_index(idx)["lengths"].tolist() == [8, 8]
    with pytest.raises(ValueError, match="magic"):
        parse_index(b"x" * 40)
    with pytest.raises(ValueError, match="bytes, the header implies"):
        parse_index(idx[:-8])


def test_verify_names_a_missing_or_changed_format_file(packed: dict[str, Any], tmp_path: Path) -> None:
    source = packed["out"]["megatron"]
    out = tmp_path / "copy"
    convert(str(packed["out"]["parquet"]), "megatron", str(out), **quiet)
    last = sorted((source / "data").glob("*.idx"))[-1]  # fewer packs: another .idx than the first's
    (out / "data/part-00000.idx").write_bytes(last.read_bytes())
    (out / "packs/part-00002.parquet").unlink()
    args = out / DATA_ARGS
    args.write_text(args.read_text() + "1 /elsewhere/part-00009\n")
    problems = verify(str(out)).problems
    assert any("part-00000.idx: size or sha256 differs" in p for p in problems)
    assert any("packs/part-00002.parquet: listed in the manifest but missing" in p for p in problems)
    assert any(f"{DATA_ARGS}: size or sha256 differs" in p for p in problems)


def test_a_vocabulary_with_gaps_gets_the_dtype_of_its_largest_id(tmp_path: Path) -> None:
    """A tokenizer of 276 tokens whose added token is id 70,000: the token files hold ids up to
    70,000, so olmo writes uint32 (not uint16, where 70,000 wrapped to 4,464) and megatron int32;
    every id reads back as it went in, and a dtype too small is an error, never a wrap."""
    from raypack.demo import train_byte_level_bpe
    from raypack.formats import tokens_as
    from tests.conftest import random_text

    tok = train_byte_level_bpe(
        [random_text(random.Random(i), 100) for i in range(100)], 300, ["<|endoftext|>"]
    )
    data = json.loads(tok.to_str())
    data["model"]["vocab"]["<|gap|>"] = 70_000
    special = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    data["added_tokens"].append({"id": 70_000, "content": "<|gap|>", **special})
    path = tmp_path / "gaps.json"
    path.write_text(json.dumps(data))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(2)
    write = [{"text": f"{random_text(rng, 30)} <|gap|> {random_text(rng, 20)}"} for _ in range(40)]
    (corpus / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in write))
    for fmt, dtype in (("olmo", "uint32"), ("megatron", "int32")):
        out = tmp_path / f"out-{fmt}"
        # olmo: a pad that is not EOS (this tokenizer names no pad token, and EOS is id 0).
        cfg = job(tmp_path, corpus, path, out, fmt, output={"pad_id": 1 if fmt == "olmo" else None})
        run_job(cfg, **quiet)
        assert manifest(out)["format"]["dtype"] == dtype and manifest(out)["tokenizer"]["max_id"] == 70_000
        tokens, _ = stacked(out)
        assert np.count_nonzero(tokens == 70_000) == 40
        assert verify(str(out), cfg, sample=40).ok
        if fmt == "olmo":  # docs/trainers.md: without the manifest's dtype OLMo-core misreads them
            from olmo_core.data import NumpyFSLDataset

            m = manifest(out)
            paths = [str(out / f["path"]) for f in sorted(m["files"], key=lambda f: f["path"])]
            common = {"sequence_length": SEQ, "pad_token_id": 0, "eos_token_id": 0, "vocab_size": 70_001}
            assert len(NumpyFSLDataset(*paths, dtype=np.uint32, **common)) == m["counts"]["packs"]
            assert len(NumpyFSLDataset(*paths, **common)) == 2 * m["counts"]["packs"]  # uint16 by default
    with pytest.raises(ValueError, match=r"do not fit its uint16 tokens"):
        tokens_as(np.asarray([[1, 70_000]], dtype=np.int32), "uint16", "data/part-00000.npy")


@pytest.mark.parametrize(("masked", "threads"), [(False, 1), (True, 1), (False, 2), (True, 3), (False, 5)])
def test_a_parquet_file_written_a_row_group_at_a_time_has_the_bytes_of_the_whole_table_written_once(
    tmp_path: Path, masked: bool, threads: int
) -> None:
    """The write task streams a parquet file through a ring of row groups' buffers (materialize),
    encoding them on `threads` threads: its bytes must be those of the same packs written as one
    table with PARQUET_SETTINGS, and of the format's encode, over several row groups (2,500 packs:
    three), items arriving in pieces out of order, with and without a mask."""
    from raypack.formats import PARQUET_SETTINGS, Settings, make_spec
    from raypack.pipeline.write.materialize import write_pack_file

    rng = np.random.default_rng(7)
    capacity, packs = 16, 2_500
    rows = []
    for pack in range(packs):
        used, slot = 0, 0
        while used < capacity - 2 and (slot == 0 or rng.random() < 0.6):
            n = int(rng.integers(1, capacity - used))
            ids = rng.integers(0, 500, n).astype(np.int32)
            if masked:  # untrained tokens staged as -(id + 1)
                ids = np.where(rng.random(n) < 0.3, -ids - 1, ids).astype(np.int32)
            rows.append((pack, slot, f"d{pack}-{slot}", ids))
            used, slot = used + n, slot + 1
    order = rng.permutation(len(rows))
    pieces = [
        pa.table(
            {
                "file_key": pa.array(np.zeros(len(part), np.int64)),
                "pack": pa.array([rows[i][0] for i in part], pa.int64()),
                "slot": pa.array([rows[i][1] for i in part], pa.int32()),
                "capacity": pa.array(np.full(len(part), capacity, np.int32)),
                "doc_id": [rows[i][2] for i in part],
                "chunk": pa.array(np.zeros(len(part), np.int32)),
                "length": pa.array([len(rows[i][3]) for i in part], pa.int32()),
                "source": pa.array(np.full(len(part), -1, np.int32)),
                "start": pa.array(np.zeros(len(part), np.int64)),
                "tokens": pa.array([rows[i][3] for i in part], pa.list_(pa.int32())),
            },
            schema=schema.ITEMS,
        )
        for part in np.array_split(order, 3)
    ]
    settings = Settings(
        seq_len=capacity,
        bucketed=False,
        add_eos=True,
        eos_id=1,
        max_id=500,
        pad_id=0,
        shard_rows=packs,
        masked=masked,
    )
    spec = make_spec("parquet", settings)
    written = write_pack_file(pa.concat_tables(pieces), str(tmp_path), spec, bucketed=False, threads=threads)
    path = tmp_path / written.column("path")[0].as_py()
    data = path.read_bytes()
    assert written.column("row_groups")[0].as_py() == [1024, 1024, 452]
    table = pq.read_table(path)
    ids = table.column("input_ids").combine_chunks().flatten().to_numpy().reshape(packs, capacity)
    mask = None
    if masked:
        mask = table.column("loss_mask").combine_chunks().flatten().to_numpy().reshape(packs, capacity)
    index = table.drop_columns([c for c in ("input_ids", "loss_mask") if c in table.column_names])
    packs = Packs("part-00000", ids, index, mask)
    sink = pa.BufferOutputStream()  # the packs as one table, written once
    pq.write_table(packs.table(), sink, **PARQUET_SETTINGS)
    assert sink.getvalue().to_pybytes() == data
    assert spec.format.encode(packs, spec) == {written.column("path")[0].as_py(): data}
    # and the tokens are where the items said: pack p's items back to back, in slot order
    for pack, slot, _, want in rows[:50]:
        start = sum(len(r[3]) for r in rows if r[0] == pack and r[1] < slot)
        got = ids[pack, start : start + len(want)]
        assert np.array_equal(got, np.where(want < 0, -want - 1, want))
