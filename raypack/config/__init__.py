"""Configuration: frozen dataclasses, validated when built, so a bad value fails before any work.

Every section is `@dataclass(frozen=True, kw_only=True, slots=True)` with its checks in __post_init__,
a module a section (input.py, tokenizer.py, pack.py, output.py: output and storage, run.py), JobConfig in
job.py with the checks that need several; `from_dict` (load.py) builds one from plain data (a YAML
mapping, `--set key=value` overrides), rejecting unknown keys and wrong types with a message that
names the key. A new key is a field (with its docstring and check) in its section's dataclass;
docs/configuration.md is rendered from those docstrings (`python -m raypack.config.reference --write`,
which tests/test_config_reference.py keeps current).
"""

from raypack.config.cache import CacheConfig
from raypack.config.input import INPUT_FORMATS, InputConfig, Reading, SourceConfig
from raypack.config.job import BYTES_PER_FILE_POSITION, MAX_FILE_POSITIONS, SHARDED_ALGORITHMS, JobConfig
from raypack.config.load import apply_overrides, from_dict, load_config, parse_override, typed_fields
from raypack.config.output import MASKED_FORMATS, OUTPUT_FORMATS, OutputConfig, StorageConfig
from raypack.config.pack import ALGORITHM_OPTION_FIELDS, LOSS_POLICIES, PACK_MODES, PackConfig
from raypack.config.run import EXECUTORS, RunConfig
from raypack.config.tokenizer import TOKENIZER_BACKENDS, TokenizerConfig
from raypack.errors import ConfigError

__all__ = [
    "ALGORITHM_OPTION_FIELDS",
    "BYTES_PER_FILE_POSITION",
    "EXECUTORS",
    "INPUT_FORMATS",
    "LOSS_POLICIES",
    "MASKED_FORMATS",
    "MAX_FILE_POSITIONS",
    "OUTPUT_FORMATS",
    "PACK_MODES",
    "SHARDED_ALGORITHMS",
    "TOKENIZER_BACKENDS",
    "CacheConfig",
    "ConfigError",
    "InputConfig",
    "JobConfig",
    "OutputConfig",
    "PackConfig",
    "Reading",
    "RunConfig",
    "SourceConfig",
    "StorageConfig",
    "TokenizerConfig",
    "apply_overrides",
    "from_dict",
    "load_config",
    "parse_override",
    "typed_fields",
]
