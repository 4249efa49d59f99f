"""The tokenizer's files and the chat template's, read from local disk or object storage: the one
module of raypack.text that reads storage. Everything else here works on what it read (bytes, text),
so a worker that was handed the bytes (a local pool's) reads nothing."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime
from typing import Any

from raypack.config import JobConfig, StorageConfig, TokenizerConfig
from raypack.errors import ConfigError
from raypack.storage import join, read_bytes, resolve
from raypack.text.chat import CHAT_FILE, ChatTemplate, template_variables
from raypack.text.tokenizer import CONFIG_FILES, TOKENIZER_FILE, LoadedTokenizer, load_tokenizer

__all__ = ["chat_template", "load_template", "read_tokenizer", "tokenizer_files"]


def tokenizer_files(cfg: TokenizerConfig, storage: StorageConfig | None = None) -> dict[str, bytes]:
    """The tokenizer's files, read (load_tokenizer's first step, apart for a job to fail fast on a
    missing one and parse it beside Ray's start); ConfigError when there are none."""
    return _read_files(cfg.path, storage)


def read_tokenizer(
    cfg: TokenizerConfig, storage: StorageConfig | None = None, *, framed: bool = True, lazy: bool = False
) -> LoadedTokenizer:
    """load_tokenizer of the files at tokenizer.path."""
    return load_tokenizer(cfg, tokenizer_files(cfg, storage), framed=framed, lazy=lazy)


def _read_files(path: str, storage: StorageConfig | None) -> dict[str, bytes]:
    """{TOKENIZER_FILE: bytes} for a file; for a directory also the CONFIG_FILES it has."""
    import pyarrow.fs as pafs

    try:
        fs, inner = resolve(path, storage)
        kind = fs.get_file_info(inner).type
        if kind == pafs.FileType.NotFound:
            raise ConfigError(f"tokenizer file not found: {path}")
        if kind != pafs.FileType.Directory:
            return {TOKENIZER_FILE: read_bytes(path, storage)}
        try:
            files = {TOKENIZER_FILE: read_bytes(join(path, TOKENIZER_FILE), storage)}
        except FileNotFoundError:
            raise ConfigError(f"tokenizer directory {path} has no {TOKENIZER_FILE}") from None
        for name in CONFIG_FILES:
            with suppress(FileNotFoundError):  # each is optional
                files[name] = read_bytes(join(path, name), storage)
        return files
    except FileNotFoundError:
        raise ConfigError(f"tokenizer file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from None


def load_template(
    cfg: TokenizerConfig, configs: dict[str, dict[str, Any]], storage: StorageConfig | None
) -> tuple[str, str]:
    """(template text, where it came from): tokenizer.chat_template, else the model directory's
    chat_template.jinja, else its tokenizer_config.json `chat_template` (a string, or a list of named
    templates: "default"). ConfigError when there is none."""
    from raypack.storage import join, read_bytes, resolve

    def read(path: str) -> str:
        try:
            return read_bytes(path, storage).decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(f"tokenizer.chat_template: file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read chat template {path}: {str(e).splitlines()[0]}") from None

    if cfg.chat_template:
        return read(cfg.chat_template), cfg.chat_template
    import pyarrow.fs as pafs

    fs, inner = resolve(cfg.path, storage)
    if fs.get_file_info(inner).type == pafs.FileType.Directory:
        jinja = join(cfg.path, CHAT_FILE)
        if fs.get_file_info(resolve(jinja, storage)[1]).type == pafs.FileType.File:
            return read(jinja), jinja
    value = configs.get("tokenizer_config.json", {}).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if isinstance(value, str) and value:
        return value, join(cfg.path, "tokenizer_config.json")
    hint = ""
    if fs.get_file_info(inner).type == pafs.FileType.File:
        # A tokenizer.json given alone is read alone (as transformers' tokenizer_file= reads it): say
        # so when its directory holds a template, rather than leave the user to guess why none is seen.
        folder = cfg.path.rstrip("/").rsplit("/", 1)[0] if "/" in cfg.path.rstrip("/") else "."
        beside = [n for n in (CHAT_FILE, "tokenizer_config.json") if _is_file(join(folder, n), storage)]
        if beside:
            hint = (
                f"; {folder} beside it has {' and '.join(beside)}: set tokenizer.path to that directory to "
                "use its template (and its special tokens)"
            )
    raise ConfigError(
        f"input.messages_field needs a chat template, and tokenizer {cfg.path} has none ({CHAT_FILE} or "
        f"tokenizer_config.json chat_template){hint or ': set tokenizer.chat_template to a template file'}"
    )


def _is_file(path: str, storage: StorageConfig | None) -> bool:
    import pyarrow.fs as pafs

    from raypack.storage import resolve

    try:
        fs, inner = resolve(path, storage)
        return bool(fs.get_file_info(inner).type == pafs.FileType.File)
    except OSError:
        return False


def chat_template(cfg: JobConfig, tok: LoadedTokenizer) -> ChatTemplate | None:
    """The job's compiled chat template (conversations only; None otherwise), with the special tokens
    the tokenizer names (chat.template_variables) and tokenizer.chat_date as the date it prints."""
    if cfg.input.chat != "messages":
        return None
    source, origin = load_template(cfg.tokenizer, tok.configs, cfg.storage)

    def text(token_id: int | None) -> str | None:
        return tok.token(token_id) if token_id is not None else None

    variables = template_variables(
        tok.configs,
        {"bos_token": text(tok.bos_id), "eos_token": text(tok.eos_id)},
        {"bos_token": text(cfg.tokenizer.bos_id), "eos_token": text(cfg.tokenizer.eos_id)},
    )
    date = cfg.tokenizer.chat_date
    now = datetime.fromisoformat(date) if date else None
    return ChatTemplate(source, origin, variables, now, spans=cfg.tokenizer.chat_spans)
