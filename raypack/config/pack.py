"""pack: how documents become packs (raypack.packing's algorithms and their settings)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from raypack.errors import ConfigError
from raypack.packing import ALGORITHMS, OVERFLOW_POLICIES, Items, decompose, nnlshp
from raypack.packing.bucket import DEFAULT_PADDING_THRESHOLD, default_buckets

__all__ = ["ALGORITHM_OPTION_FIELDS", "LOSS_POLICIES", "PACK_MODES", "PackConfig"]

LOSS_POLICIES = ("assistant", "completion", "all")  # pack.loss (raypack.text.chat)
PACK_MODES = ("global", "sharded")
# PackConfig field → the keyword option of the packers that take it.
ALGORITHM_OPTION_FIELDS = {
    "max_depth": "max_depth",
    "bucket_lengths": "bucket_lengths",
    "padding_threshold": "padding_threshold",
    "nnls_bin_width": "bin_width",
    "min_seq_len": "min_seq_len",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PackConfig:
    """How documents become packs: their length, the packer and its settings, what becomes of a
    longer document, and which tokens are trained."""

    seq_len: int = 2048
    """Tokens per pack (the largest bucket for `bucket`)."""
    algorithm: str = "bfd"
    """The packer (raypack.packing.ALGORITHMS; docs/algorithms.md). mode global takes a histogram
    packer (bfd, lpfhp, spfhp, nnlshp, bucket); mode sharded bfd, ffd or greedy."""
    overflow: str = "split"
    """Documents longer than seq_len: split (chunks of seq_len + a remainder), truncate (the first
    seq_len tokens kept), or drop. Chat data: truncate or drop, a conversation is never split. A
    truncated or dropped document has a reject saying so in rejects/ (standing for no record)."""
    seed: int = 0
    """Seed for the order of packs in the output, and for a mixture's selection (input.sources)."""
    shuffle: bool = True
    """Permute pack ids with `seed` (packers that sort by length would otherwise emit a length-sorted
    dataset, which biases training); false keeps plan order."""
    max_depth: int | None = None
    """Most items (documents, or chunks of one) per pack, for attention kernels with a fixed
    segment budget (google/grain #1000; MaxText passes 32). Every packer honours it but concat,
    which cuts one stream every seq_len and refuses it; None: unlimited (nnlshp's strategies then
    hold 3, the paper's setting, and never more than min(max_depth, 3))."""
    bucket_lengths: tuple[int, ...] | None = None
    """Bucket lengths for `bucket`, largest = seq_len (None: seq_len/8, /4, /2, seq_len)."""
    padding_threshold: float = DEFAULT_PADDING_THRESHOLD
    """`bucket`: largest padding share a smaller bucket may have before a larger one is tried."""
    nnls_bin_width: int | None = None
    """`nnlshp`: tokens per length class (None: seq_len / 256, rounded up)."""
    min_seq_len: int | None = None
    """`decompose`: the shortest chunk, a power of two (seq_len, the longest, one too). A document's
    last `length mod min_seq_len` tokens are left out, as OLMo-core's VSL dataset does (it takes
    256): counted in metrics' tokens_dropped, and a reject each in rejects/ (standing for no
    record: the document is packed); None: 1, every token kept."""
    mode: str = "global"
    """global: one plan over the whole corpus (histogram packers). sharded: every group of
    `shards_per_group` input shards is packed on its own by one task (bfd, ffd, greedy): no shuffle of
    tokens, a little less efficiency."""
    shards_per_group: int = 1
    """mode sharded: the input shards (work units) one task packs together."""
    loss: str | None = None
    """Conversations and prompt/completion pairs (input.messages_field, input.prompt_field): which
    tokens are trained. assistant (messages; the default): the assistant turns' tokens; completion
    (pairs; the default): the completion's; all: every token. Plain text trains every token."""
    pad_multiple: int = 1
    """Every item (a document, or a chunk of one) takes a multiple of this many positions in its
    pack, its padding (pad_id, never trained) right after it, so every item starts at a multiple of
    it: 2 × CP (or TP × CP × 2) for the THD path of Megatron and Transformer Engine under context
    parallelism (docs/trainers.md). It must divide seq_len (and every bucket length), so a chunk of a
    split document is seq_len tokens exactly and every pack's end padding is a multiple too. Formats
    parquet, megatron and bridge keep it (the others' trainers read no padded boundaries). 1: off."""
    compare: tuple[str, ...] = ()
    """Histogram packers to plan as well, on the same histogram, for the comparison table of metrics.json
    and the report (plans only: the data holds `algorithm`'s packs); ["all"]: every histogram packer."""

    def __post_init__(self) -> None:
        self._check_packer()
        self._check_buckets()
        self._check_loss_and_mode()
        self._check_nnls()
        self._check_decompose()
        self._check_pad_multiple()
        self.compared()  # every listed packer known, planned from a histogram, and its settings valid

    def _check_packer(self) -> None:
        """What a pack is: its length, the packer, what becomes of a longer document, and the cap on
        items a pack (which one packer cannot keep)."""
        if self.seq_len < 1:
            raise ConfigError(f"pack.seq_len must be >= 1, got {self.seq_len}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"pack.algorithm {self.algorithm!r} is unknown; choose from {', '.join(ALGORITHMS)}"
            )
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(
                f"pack.overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}"
            )
        if self.max_depth is not None and self.max_depth < 1:
            raise ConfigError(f"pack.max_depth must be >= 1 or null, got {self.max_depth}")
        if self.max_depth is not None and "max_depth" not in ALGORITHMS[self.algorithm].options:
            raise ConfigError(
                f"pack.max_depth: {self.algorithm} cannot cap documents per pack (it cuts one stream of "
                "every document every seq_len tokens); use bfd (or any other packer) with max_depth"
            )

    def _check_buckets(self) -> None:
        """`bucket`'s settings: its lengths, the largest seq_len, and its padding threshold."""
        if self.bucket_lengths is not None:
            if not self.bucket_lengths or min(self.bucket_lengths) < 1:
                raise ConfigError(f"pack.bucket_lengths must be positive, got {list(self.bucket_lengths)}")
            if max(self.bucket_lengths) != self.seq_len:
                raise ConfigError(
                    f"pack.bucket_lengths: the largest bucket must equal seq_len={self.seq_len}, "
                    f"got {list(self.bucket_lengths)}"
                )
        if not 0.0 <= self.padding_threshold < 1.0:
            raise ConfigError(f"pack.padding_threshold must be in [0, 1), got {self.padding_threshold}")

    def _check_loss_and_mode(self) -> None:
        """Which tokens are trained, and whether the plan is global or a group of shards'."""
        if self.loss is not None and self.loss not in LOSS_POLICIES:
            raise ConfigError(f"pack.loss must be one of {', '.join(LOSS_POLICIES)}, got {self.loss!r}")
        if self.mode not in PACK_MODES:
            raise ConfigError(f"pack.mode must be one of {', '.join(PACK_MODES)}, got {self.mode!r}")
        if self.shards_per_group < 1:
            raise ConfigError(f"pack.shards_per_group must be >= 1, got {self.shards_per_group}")

    def _check_nnls(self) -> None:
        """`nnlshp`'s length classes: a width within the pack, giving no more classes than it
        plans in seconds."""
        if self.nnls_bin_width is not None and not 1 <= self.nnls_bin_width <= self.seq_len:
            raise ConfigError(f"pack.nnls_bin_width must be in 1..seq_len, got {self.nnls_bin_width}")
        too_many = nnlshp.too_many_classes(self.seq_len, self.nnls_bin_width) if self.nnls_bin_width else ""
        if too_many:
            raise ConfigError(f"pack.nnls_bin_width {too_many}, or leave it out")

    def _check_pad_multiple(self) -> None:
        """Items aligned to pad_multiple: a divisor of every pack length, by a packer that places
        items (concat cuts one stream)."""
        k = self.pad_multiple
        if k < 1:
            raise ConfigError(f"pack.pad_multiple must be >= 1 (1: no alignment), got {k}")
        if k == 1:
            return
        if self.seq_len % k:
            lower, upper = self.seq_len // k * k, -(-self.seq_len // k) * k
            near = f"{lower} or {upper}" if lower else str(upper)
            raise ConfigError(
                f"pack.pad_multiple {k} must divide pack.seq_len {self.seq_len} (every pack and every "
                f"chunk of a split document is then a multiple of it); use seq_len {near}"
                + ("" if k % 2 == 0 else " (context parallelism takes 2 x CP, an even number)")
            )
        if self.algorithm == "bucket":
            lengths = self.bucket_lengths or default_buckets(self.seq_len)
            odd = [n for n in lengths if n % k]
            if odd:
                raise ConfigError(
                    f"pack.pad_multiple {k} must divide every bucket length; {odd} do not "
                    "(set pack.bucket_lengths to multiples of it)"
                )
        if not ALGORITHMS[self.algorithm].aligns:
            raise ConfigError(
                f"pack.pad_multiple: {self.algorithm} cuts one stream of every document every seq_len "
                "tokens and cannot align them; use bfd (or any other packer) with pad_multiple"
            )

    def _check_decompose(self) -> None:
        """`decompose`'s lengths: seq_len and min_seq_len powers of two; min_seq_len for it alone."""
        if self.algorithm != "decompose":
            if self.min_seq_len is not None:
                raise ConfigError(f"pack.min_seq_len is decompose's; {self.algorithm} takes none")
            return
        if not decompose.is_power_of_two(self.seq_len):
            raise ConfigError(f"pack.seq_len must be a power of two for decompose, got {self.seq_len}")
        low = self.min_seq_len if self.min_seq_len is not None else 1
        if not decompose.is_power_of_two(low) or low > self.seq_len:
            raise ConfigError(
                f"pack.min_seq_len must be a power of two at most seq_len={self.seq_len}, got {low}"
            )
        if self.mode != "global":
            raise ConfigError("pack.algorithm decompose plans globally: set pack.mode: global")
        if self.pad_multiple != 1:
            raise ConfigError(
                "pack.pad_multiple: decompose's chunks are powers of two of at least pack.min_seq_len, "
                "each already a multiple of every power of two up to it; leave pad_multiple at 1 and "
                "set min_seq_len to at least 2 x CP"
            )

    @property
    def bucketed(self) -> bool:
        """Packs of several lengths, a bucket of files each (bucket and decompose, planned globally)."""
        return self.mode == "global" and self.algorithm in ("bucket", "decompose")

    def make_items(self, lengths: np.ndarray) -> Items:
        """The items of documents of `lengths` under these settings (the packer's own: decompose
        cuts every document into its chunks; the others apply `overflow`)."""
        return ALGORITHMS[self.algorithm].items(
            lengths, self.seq_len, self.overflow, self.pad_multiple, **self.algorithm_options()
        )

    def compared(self) -> tuple[PackConfig, ...]:
        """The config of each packer in `compare` other than `algorithm`, in ALGORITHMS order."""
        histogram = [name for name, a in ALGORITHMS.items() if a.is_histogram and a.compared]
        if self.compare and not ALGORITHMS[self.algorithm].compared:
            raise ConfigError(
                f"pack.compare: {self.algorithm}'s items are its own chunks, on which no other packer's "
                "plan compares; leave pack.compare out"
            )
        if "all" in self.compare and len(self.compare) > 1:
            raise ConfigError(f"pack.compare: 'all' stands alone, got {list(self.compare)}")
        for name in self.compare:
            if name != "all" and name not in histogram:
                what = "is unknown"
                if name in ALGORITHMS:
                    what = (
                        "plans its own items"
                        if ALGORITHMS[name].is_histogram
                        else "needs every document in one process"
                    )
                raise ConfigError(
                    f"pack.compare: {name!r} {what}; a job compares histogram packers only "
                    f"({', '.join(histogram)}); `raypack plan --lengths OUTPUT` compares all "
                    f"{len(ALGORITHMS)} on a finished dataset's document lengths"
                )
        names = histogram if self.compare == ("all",) else [n for n in histogram if n in self.compare]
        configs = []
        for name in names:
            if name == self.algorithm:
                continue
            try:
                configs.append(dataclasses.replace(self, algorithm=name, compare=()))
            except ConfigError as e:
                raise ConfigError(f"pack.compare includes {name}: {e}") from None
        return tuple(configs)

    def algorithm_options(self) -> dict[str, Any]:
        """Keyword options for the chosen packer, from the fields that apply to it."""
        accepted = ALGORITHMS[self.algorithm].options
        return {
            option: getattr(self, name)
            for name, option in ALGORITHM_OPTION_FIELDS.items()
            if option in accepted and getattr(self, name) is not None
        }
