"""output and storage: where and how the packs are written (raypack.formats), and how object storage
is reached."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from raypack.errors import ConfigError

__all__ = ["MASKED_FORMATS", "OUTPUT_FORMATS", "OutputConfig", "StorageConfig"]

OUTPUT_FORMATS = ("parquet", "megatron", "olmo", "mds", "trl", "bridge")  # raypack.formats.FORMATS
# Formats that keep a per-token loss mask: the others refuse conversations (their trainers would train
# every token).
MASKED_FORMATS = ("parquet", "trl", "bridge")


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputConfig:
    """Where and how the packs are written (docs/output-format.md)."""

    path: str
    """Output directory, local or s3://...; complete only once manifest.json exists."""
    format: str = "parquet"
    """How packs are stored (raypack.formats), as the trainer reads them natively: parquet (raypack's
    own, a row a pack), megatron (.bin/.idx pairs for Megatron-LM), olmo (token files for OLMo-core),
    mds (MosaicML streaming); for chat data parquet (with loss_mask), trl (TRL's padding-free rows)
    or bridge (Megatron-Bridge's packed SFT). Checked against the tokenizer and pack settings before
    any work."""
    shard_rows: int = 10000
    """Packs per output file, at most: a bucket's packs (a shard group's, in sharded mode) go into
    ceil(packs / shard_rows) files as even as can be, their sizes one pack apart at most.
    shard_rows × seq_len must be under 2^31 (an Arrow list's offsets)."""
    pad_id: int | None = None
    """Token id written into padding positions (never attended: doc_offsets ends before them). None:
    the tokenizer's pad token (tokenizer_config.json pad_token, or a token named <|pad|>, <pad>,
    [PAD]), else its EOS (LoadedTokenizer.pad), never a silent 0 (DeepSeek's BOS); the manifest
    records which. Set, it must be a token of the vocabulary (checked before any work). megatron
    writes EOS there whatever this says, which its --eod-mask-loss masks."""
    keep_versions: int = 3
    """`raypack rebuild`: complete versions (v=NNNNNN/) kept under output.path, the newest included."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("output.path must not be empty")
        if self.format not in OUTPUT_FORMATS:
            choices = ", ".join(OUTPUT_FORMATS)
            raise ConfigError(f"output.format must be one of {choices}, got {self.format!r}")
        if self.shard_rows < 1:
            raise ConfigError(f"output.shard_rows must be >= 1, got {self.shard_rows}")
        if (
            self.pad_id is not None and not 0 <= self.pad_id < 2**31
        ):  # int32 ids; checked against the vocabulary
            raise ConfigError(f"output.pad_id must be in 0..2^31-1, got {self.pad_id}")
        if self.keep_versions < 1:
            raise ConfigError(f"output.keep_versions must be >= 1, got {self.keep_versions}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageConfig:
    """Where object storage is and how hard to try. Credentials are not here on purpose: they come from
    the standard places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws, instance roles) and are never
    printed, logged or written to the manifest."""

    endpoint: str | None = None
    """S3-compatible endpoint URL (http://host:9000 for MinIO/SeaweedFS); None: AWS_ENDPOINT_URL, else AWS."""
    region: str | None = None
    """None: AWS_REGION / AWS_DEFAULT_REGION, else the bucket's own region (looked up once)."""
    max_attempts: int = 6
    """Attempts per S3 request, with exponential backoff between them (AWS standard retry strategy)."""
    connect_timeout: float = 5.0
    """Seconds to open a connection: an unreachable endpoint fails in seconds, not minutes, with
    exit code 2."""

    def __post_init__(self) -> None:
        if self.endpoint is not None and "://" not in self.endpoint:
            raise ConfigError(f"storage.endpoint must be a URL like http://host:port, got {self.endpoint!r}")
        if self.endpoint is not None and "@" in self.endpoint.split("://", 1)[1]:
            raise ConfigError(
                "storage.endpoint must not hold credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"storage.max_attempts must be >= 1, got {self.max_attempts}")
        if self.connect_timeout <= 0:
            raise ConfigError(f"storage.connect_timeout must be > 0, got {self.connect_timeout}")

    def from_environment(self) -> StorageConfig:
        """These settings with the endpoint and region the driver's environment names filled in, so
        that workers (whose environment is the cluster's, not the submitter's) use the same ones.
        Neither is a secret; credentials stay in the environment."""
        import os

        env = os.environ
        return dataclasses.replace(
            self,
            endpoint=self.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            region=self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        )
