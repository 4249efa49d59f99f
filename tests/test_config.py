from __future__ import annotations

import pytest

from raypack.config import ConfigError, JobConfig, PackConfig, apply_overrides, from_dict


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"seq_len": 0}, "seq_len must be >= 1"),
        ({"seq_len": "2048"}, "seq_len must be an integer"),
        ({"seq_len": True}, "seq_len must be an integer"),
        ({"algorithm": "best"}, "algorithm 'best' is unknown"),
        ({"overflow": "wrap"}, "overflow must be one of"),
        ({"max_depth": 0}, "max_depth must be >= 1"),
        ({"algorithm": "concat", "max_depth": 4, "mode": "sharded"}, "concat cannot cap documents per pack"),
        ({"seq_len": 4096, "bucket_lengths": [1024, 2048]}, "largest bucket must equal seq_len"),
        ({"bucket_lengths": "2048"}, "bucket_lengths must be a list"),
        ({"padding_threshold": 1.5}, "padding_threshold must be in"),
        ({"nnls_bin_width": 0}, "nnls_bin_width"),
        # 8192 classes: a 342 GiB matrix, refused before tokenizing; 513 plan for minutes
        ({"seq_len": 8192, "nnls_bin_width": 1}, "8192 classes of seq_len 8192.*at least 16"),
        ({"seq_len": 1026, "nnls_bin_width": 2}, "513 classes"),
        ({"shuffle": "yes"}, "shuffle must be true or false"),
        ({"seqlen": 2048}, "unknown key seqlen"),
        ({"compare": ["ffd"]}, "'ffd' needs every document in one process"),
        ({"compare": ["best"]}, "'best' is unknown"),
        ({"compare": ["all", "bfd"]}, "'all' stands alone"),
        ({"compare": "all"}, "compare must be a list"),
        ({"pad_multiple": 0}, r"pad_multiple must be >= 1 \(1: no alignment\)"),
        (
            {"seq_len": 100, "pad_multiple": 8},
            "pad_multiple 8 must divide pack.seq_len 100.*seq_len 96 or 104",
        ),
        ({"seq_len": 6, "pad_multiple": 8}, "use seq_len 8$"),
        ({"seq_len": 64, "algorithm": "bucket", "pad_multiple": 16}, r"every bucket length; \[8\] do not"),
        ({"algorithm": "concat", "mode": "sharded", "pad_multiple": 4}, "concat cuts one stream"),
        (
            {"algorithm": "decompose", "seq_len": 1024, "min_seq_len": 64, "pad_multiple": 8},
            "decompose's chunks are powers of two of at least pack.min_seq_len",
        ),
    ],
)
def test_bad_values_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(PackConfig, data)


def test_valid_config_and_algorithm_options() -> None:
    cfg = from_dict(PackConfig, {"seq_len": 4096, "algorithm": "bucket", "bucket_lengths": [4096, 1024]})
    assert cfg.bucket_lengths == (4096, 1024)
    assert cfg.algorithm_options() == {"bucket_lengths": (4096, 1024), "padding_threshold": 0.01}
    assert from_dict(PackConfig, {"max_depth": 3}).algorithm_options() == {"max_depth": 3}
    assert from_dict(PackConfig, {"algorithm": "ffd"}).algorithm_options() == {}


def test_overrides_are_read_as_yaml() -> None:
    data = apply_overrides(
        {"pack": {"seq_len": 2048}}, ["pack.seq_len=8192", "pack.shuffle=false", "x.y=[1, 2]"]
    )
    assert data == {"pack": {"seq_len": 8192, "shuffle": False}, "x": {"y": [1, 2]}}
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["pack.seq_len"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"pack": 3}, ["pack.seq_len=1"])


def test_overrides_reach_list_entries_by_place_or_name() -> None:
    """input.sources is a list: --set enters it by an entry's place or its name, and leaves the
    caller's mapping as it was."""
    base = {"input": {"sources": [{"name": "web", "weight": 0.7}, {"name": "code", "weight": 0.3}]}}
    data = apply_overrides(base, ["input.sources.0.weight=0.6", "input.sources.code.weight=0.4"])
    assert data["input"]["sources"] == [{"name": "web", "weight": 0.6}, {"name": "code", "weight": 0.4}]
    assert base["input"]["sources"][0]["weight"] == 0.7
    assert apply_overrides({"input": {"paths": ["a", "b"]}}, ["input.paths.1=c"]) == {
        "input": {"paths": ["a", "c"]}
    }
    with pytest.raises(ConfigError, match=r"input\.sources has 2 entries, none at 2"):
        apply_overrides(base, ["input.sources.2.weight=1"])
    with pytest.raises(ConfigError, match=r"no entry named 'books'.*'web', 'code'"):
        apply_overrides(base, ["input.sources.books.weight=1"])
    with pytest.raises(ConfigError, match=r"'input\.sources\.0\.weight\.x=1': weight is not a section"):
        apply_overrides(base, ["input.sources.0.weight.x=1"])
    with pytest.raises(ConfigError, match=r"'input\.paths\.0\.x\.y=1': 0 is not a section"):
        apply_overrides({"input": {"paths": ["a"]}}, ["input.paths.0.x.y=1"])


def test_compare_lists_the_other_histogram_packers_with_the_settings_that_apply() -> None:
    cfg = from_dict(PackConfig, {"algorithm": "lpfhp", "max_depth": 3, "compare": ["all"]})
    assert [c.algorithm for c in cfg.compared()] == ["bfd", "spfhp", "nnlshp", "bucket"]
    assert all(c.compare == () and c.max_depth == 3 for c in cfg.compared())
    # bucket takes the depth cap too (every packer does but concat)
    assert [c.algorithm_options() for c in cfg.compared()][-1] == {"padding_threshold": 0.01, "max_depth": 3}
    cfg = from_dict(PackConfig, {"compare": ["bucket", "bfd", "spfhp"]})
    assert [c.algorithm for c in cfg.compared()] == ["spfhp", "bucket"]  # table order, not bfd twice
    assert from_dict(PackConfig, {}).compared() == ()


def test_a_file_too_large_for_int32_offsets_fails_in_config() -> None:
    """shard_rows × seq_len token positions must fit the int32 offsets of input_ids: found in the config,
    not by an overflowing cast in a write task after the corpus was tokenized."""
    base = {
        "input": {"paths": ["x/*.jsonl"]},
        "tokenizer": {"path": "t.json"},
        "output": {"path": "out/", "shard_rows": 262_144},  # × 8192 = 2^31
        "pack": {"seq_len": 8192},
    }
    with pytest.raises(ConfigError, match=r"2,147,483,648 token positions a file.*shard_rows <= 262,143"):
        from_dict(JobConfig, base)
    ok = from_dict(JobConfig, apply_overrides(base, ["output.shard_rows=262143"]))
    assert ok.output.shard_rows * ok.pack.seq_len < 2**31
