"""The job's config: its sections, and the checks that need more than one of them."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from raypack.config.cache import CacheConfig
from raypack.config.input import InputConfig, SourceConfig
from raypack.config.output import MASKED_FORMATS, OutputConfig, StorageConfig
from raypack.config.pack import PackConfig
from raypack.config.run import RunConfig
from raypack.config.tokenizer import TokenizerConfig
from raypack.errors import ConfigError
from raypack.packing import ALGORITHMS
from raypack.paths import anchored, contains, input_base, is_uri

__all__ = ["BYTES_PER_FILE_POSITION", "MAX_FILE_POSITIONS", "SHARDED_ALGORITHMS", "JobConfig"]

SHARDED_ALGORITHMS = ("bfd", "ffd", "greedy")
# Token positions in one output file (shard_rows × seq_len): input_ids is an Arrow list<int32> whose
# offsets are int32, so a file cannot hold 2^31 of them. Checked here, not found after tokenization.
# A write task holds ~20 bytes a position (the file's items, the packed rows, a scatter index):
# ~1.6 GB at the default 10,000 × 8192.
MAX_FILE_POSITIONS = 2**31 - 1
BYTES_PER_FILE_POSITION = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    input: InputConfig
    tokenizer: TokenizerConfig
    output: OutputConfig
    pack: PackConfig = field(default_factory=PackConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)

    def __post_init__(self) -> None:
        if self.pack.mode == "sharded" and self.pack.algorithm not in SHARDED_ALGORITHMS:
            raise ConfigError(
                f"pack.mode sharded packs each shard group alone with one of "
                f"{', '.join(SHARDED_ALGORITHMS)}, not {self.pack.algorithm!r}"
            )
        if self.pack.mode == "global" and not ALGORITHMS[self.pack.algorithm].is_histogram:
            histogram = ", ".join(name for name, a in ALGORITHMS.items() if a.is_histogram)
            raise ConfigError(
                f"pack.algorithm {self.pack.algorithm!r} needs every document in one process; the "
                f"distributed job packs from the length histogram: use one of {histogram}, or "
                "pack.mode: sharded"
            )
        if self.pack.algorithm == "decompose" and (self.input.mixture or self.input.chat is not None):
            what = "a mixture (input.sources)" if self.input.mixture else "conversations and pairs"
            raise ConfigError(
                f"pack.algorithm decompose cuts every document into its chunks; it does not take {what} "
                "yet: use bucket (or any other packer)"
            )
        if self.pack.seq_len < 2:
            raise ConfigError(f"pack.seq_len must be >= 2 for a training sequence, got {self.pack.seq_len}")
        for pattern in self.input.all_paths:
            # The output's data, index and a rebuild's _cache would be read back as inputs next time.
            if contains(input_base(pattern), self.output.path):
                raise ConfigError(
                    f"output.path {self.output.path} lies inside {input_base(pattern)}, where input "
                    f"{pattern} looks for files: a later run would read the output as input; write it "
                    "elsewhere"
                )
        if self.cache.path is not None:
            self._check_store(self.cache.path)
        positions = self.output.shard_rows * self.pack.seq_len
        if positions > MAX_FILE_POSITIONS:
            most = MAX_FILE_POSITIONS // self.pack.seq_len
            raise ConfigError(
                f"output.shard_rows × pack.seq_len = {positions:,} token positions a file, over the "
                f"{MAX_FILE_POSITIONS:,} one Parquet list column holds (and ~"
                f"{BYTES_PER_FILE_POSITION * positions / 2**30:.0f} GiB for its write task): "
                f"set output.shard_rows <= {most:,}"
            )

        self._check_chat()

    def _check_store(self, store: str) -> None:
        """cache.path apart from the output (which --overwrite clears) and from the inputs (a store
        would be read back as input; `raypack cache prune` deletes in it). Local paths compare with
        their links resolved: a link to an input's directory is that directory."""

        def real(path: str) -> str:
            return path if is_uri(path) else os.path.realpath(path)

        if contains(real(self.output.path), real(store)):
            raise ConfigError(
                f"cache.path {store} lies inside output.path {self.output.path}, which a pack with "
                "--overwrite clears: keep the token store elsewhere"
            )
        for pattern in self.input.all_paths:
            if contains(real(store), real(input_base(pattern))):
                raise ConfigError(
                    f"input {pattern} lies inside cache.path {store}: keep the token store apart "
                    "from the corpus (raypack cache prune deletes what is in it)"
                )
            if contains(real(input_base(pattern)), real(store)):
                raise ConfigError(
                    f"cache.path {store} lies inside {input_base(pattern)}, where input {pattern} "
                    "looks for files: keep the token store elsewhere"
                )

    def _check_chat(self) -> None:
        chat, loss = self.input.chat, self.pack.loss
        if chat is None:
            if loss not in (None, "all"):
                raise ConfigError(
                    f"pack.loss {loss} needs conversations or pairs (input.messages_field, or "
                    "input.prompt_field and completion_field); plain text trains every token"
                )
            return
        if chat == "messages" and loss == "completion":
            raise ConfigError(
                "pack.loss completion is for prompt/completion pairs; conversations take assistant or all"
            )
        if chat == "pairs" and loss == "assistant":
            raise ConfigError(
                "pack.loss assistant is for conversations; prompt/completion pairs take completion or all"
            )
        if self.pack.overflow == "split":
            raise ConfigError(
                "pack.overflow split would cut a conversation across packs (its turns then train without "
                "their context): set pack.overflow: truncate (the end is cut, counted) or drop"
            )
        if self.output.format not in MASKED_FORMATS:
            raise ConfigError(
                f"output.format {self.output.format} keeps no loss mask, so its trainer would train every "
                f"token of a conversation; use one of {', '.join(MASKED_FORMATS)}"
            )

    @property
    def framed(self) -> bool:
        """tokenizer.add_bos / add_eos frame each document: plain text and prompt/completion pairs. A
        conversation is framed by its chat template alone."""
        return self.input.chat != "messages"

    def takes(self, special: str) -> bool:
        """Whether the documents take the special token `special` ("bos", "eos", "pad"): BOS and EOS
        where tokenizer.add_bos / add_eos frame them (framed), pad in every job."""
        adds = {"bos": self.tokenizer.add_bos, "eos": self.tokenizer.add_eos, "pad": True}[special]
        return adds and (special == "pad" or self.framed)

    @property
    def loss(self) -> str:
        """pack.loss with its default: assistant (messages), completion (pairs), all (plain text)."""
        if self.pack.loss is not None:
            return self.pack.loss
        return {"messages": "assistant", "pairs": "completion"}.get(self.input.chat or "", "all")

    def anchored(self) -> JobConfig:
        """The config with every local path (inputs and their root, the tokenizer, the output, the
        token store) absolute against this process's working directory: the driver's, which a task
        on a Ray node (working directory its own) would not share. The manifest records these."""

        def source(s: SourceConfig) -> SourceConfig:
            root = anchored(s.root) if s.root else s.root
            return dataclasses.replace(s, paths=tuple(map(anchored, s.paths)), root=root)

        i = self.input
        root = anchored(i.root) if i.root else i.root
        return dataclasses.replace(
            self,
            input=dataclasses.replace(
                i, paths=tuple(map(anchored, i.paths)), root=root, sources=tuple(map(source, i.sources))
            ),
            tokenizer=dataclasses.replace(self.tokenizer, path=anchored(self.tokenizer.path)),
            output=dataclasses.replace(self.output, path=anchored(self.output.path)),
            cache=dataclasses.replace(self.cache, path=self.cache.path and anchored(self.cache.path)),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
