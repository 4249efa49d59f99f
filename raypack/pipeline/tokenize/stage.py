"""Stage 2, tokenize: every work unit becomes a staged token file
(raypack.pipeline.tokenize.token_files) and a summary the driver folds into per-run histograms and
counts (raypack.pipeline.place.histogram.Totals).

    work units ─chat self-check / backend choice─▶ keyed units (token file names)
               ─TokenizePool: a task a unit, largest first─▶ Totals (folded as summaries arrive)
               ─a fast backend's difference?─▶ every unit again with tokenizers, under its keys

The backend: chat data is encoded by tokenizers (its mask needs character offsets); plain text by
fastokens where it loads the tokenizer and gives tokenizers' ids on probes and a corpus sample
(raypack.text.backends), unless the rebuild root remembers it differing there. The workers
start with fastokens while the driver checks it (a refusal deletes what they wrote and every unit
is tokenized again). Each task re-checks a sample; at the first difference nothing more
is given out, every token file the fast backend wrote in the run is deleted, and every unit is
tokenized again with tokenizers, so the output never depends on which units a sampled check
happened to catch.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO

from raypack.config import JobConfig
from raypack.corpus.readers import read_unit
from raypack.corpus.readers.records import CUT_KINDS, reasons_text, reject_advice
from raypack.corpus.units import WorkUnit
from raypack.dataset import previous
from raypack.dataset.failover import remember_failover, remembered_failover
from raypack.errors import JobError
from raypack.pipeline.tokenize.pool import TokenizePool
from raypack.pipeline.tokenize.summary import Totals, shard_runs
from raypack.pipeline.tokenize.task import TokenizeShards
from raypack.pipeline.tokenize.token_files import (
    cached_metadata_file,
    cached_rejects_file,
    token_key,
    token_settings,
)
from raypack.progress import Progress
from raypack.storage import join, list_dir, remove
from raypack.text.backends import (
    Choice,
    choose_backend,
    failed_over,
    fastokens_version,
    reference_version,
)
from raypack.text.chat import PROBES, Chat, ChatTemplate, check_chat, render_texts
from raypack.text.files import chat_template
from raypack.text.tokenizer import LoadedTokenizer

__all__ = ["REJECT_EXAMPLES", "Tokenized", "check_rejects", "tokenize"]

# The self-check's corpus sample: the first documents of up to SAMPLE_UNITS work units spread over the
# corpus, SAMPLE_CHARS of text from each (512 KB in all: ~0.3 s of tokenizers on the driver).
SAMPLE_UNITS = 4
SAMPLE_CHARS = 128 << 10
# Conversations of the corpus the chat self-check renders beside the probes: the first of each of up
# to SAMPLE_UNITS work units, at most CHAT_SAMPLE and SAMPLE_CHARS / 4 of content from each (at least
# one): the self-check encodes them with offsets on the driver and renders them both ways (one
# render, prefixes): unbounded, 128 conversations of 8-16 turns (2.7 MB) take 1.9 s.
CHAT_SAMPLE = 32
REJECT_EXAMPLES = 3


@dataclass
class Tokenized:
    """What the tokenize stage hands on."""

    units: list[WorkUnit]
    """Every work unit with its token file."""
    totals: Totals
    choice: Choice
    """What encoded (after a failover: tokenizers, the fast choice in its failed_over)."""
    failovers: list[str]
    """Why the fast backend was abandoned in the run ([]: it was not)."""
    chat: dict[str, Any] | None
    """Chat data: its template, how the mask is found, what was checked (None for plain text)."""
    cut_rule: str = ""
    """Where long texts may be cut, and its proof (raypack.text.cuts; "" when none was cut)."""
    store: dict[str, Any] | None = None
    """The token store the units were found in or added to: its path, units found there
    ("hits"), its entries and bytes after this stage (None: the job's own staging area)."""

    def backend_record(self) -> dict[str, Any]:
        """The manifest's and the summary's account of what encoded and what was checked."""
        chosen = self.choice.failed_over or self.choice
        totals = self.totals
        return {
            "chosen": chosen.label,
            "reason": chosen.reason,
            "self_check": {"probes": self.choice.probes, "corpus_texts": self.choice.sampled},
            "units_by_backend": dict(sorted(totals.encoded_by.items())),
            "checked_in_run": {
                "texts": totals.checked_texts,
                "segments": totals.checked_segments,
                "bytes": totals.checked_bytes,
            },
            "routed_to_tokenizers": {"texts": totals.routed_texts, "bytes": totals.routed_bytes},
            "failovers": self.failovers,
            "notes": list(totals.notes),
            "finished_on": self.choice.backend,
            "long_texts": {
                "rule": self.cut_rule,
                "texts": totals.long_texts,
                "cuts": totals.cuts,
                "cuts_refused": totals.cuts_refused,
                "long_pieces": totals.long_whole,
                # Units from token store entries older than this record: their cuts are not known.
                "units_unrecorded": totals.long_unrecorded,
            },
        }


def tokenize(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    units: list[WorkUnit],
    token_dir: str,
    pool: TokenizePool,
    width: int,
    memory: str | None,
    log: Callable[[str], None],
    stream: TextIO | None = None,
    digests: dict[str, str] | None = None,
    clear: Callable[[], None] = lambda: None,
) -> Tokenized:
    """Every unit tokenized into `token_dir` (a staging area, or a token store: finished files
    there are reused); `memory`: a rebuild root's record of backends that differed there; `stream`:
    where the stage's progress goes (units done, MB/s, ETA); `digests`: each input file's content
    digest by path (raypack.dataset.store), which a store's keys are made of; `clear`: clears
    the output for the new dataset where prepare left it (a token store's job, whose tokenizer is
    parsed only if a unit must be tokenized: it is checked first, so that a file tokenizers refuses
    leaves the previous dataset in place).

    The passes, each over every unit under one backend's keys (Pass): a token store's, where it
    holds every unit under a backend this job would take (no check); else the checked backend's,
    run ahead of its check where fastokens may be it (workers start while the driver checks); then
    tokenizers', where a pass's in-run check found a fast backend's ids differ."""
    cfg, template, records, chat = _chat(cfg, tok, units, log)
    remembered = remembered_failover(memory, cfg.tokenizer.backend, tok, cfg.storage) if memory else None
    check = _backend_check(cfg, tok, units, pool, template, records)
    passes = Passes(cfg, tok, units, token_dir, pool, width, stream, digests, template, clear)
    version = fastokens_version()
    if digests is not None:
        passes.stored = _stored_choice(cfg, tok, version, remembered, passes.keyed, token_dir)

    def announce(choice: Choice) -> None:
        log(f"[raypack] tokenizer backend: {choice.label} ({choice.reason})")

    ahead = _ahead(cfg, tok, version, remembered, digests)
    if passes.stored is not None:
        choice, done = _from_store(passes, passes.stored, check)
        announce(choice)
    elif ahead is None:
        choice = remembered or check()
        announce(choice)
        done = passes.run(choice)
    else:
        choice, done = _ahead_of_check(passes, ahead, check, announce, log)
    failovers = list(done.totals.failovers)
    if failovers and choice.backend != "tokenizers":
        log(f"[raypack] {choice.backend} gave other ids than tokenizers ({failovers[0]}): tokenizing again")
        passes.discard(done)
        if memory:
            remember_failover(memory, choice, tok, failovers[0], cfg.storage)
        choice = failed_over(choice, failovers[0])
        done = passes.run(choice)
    done.totals.check_complete()
    # What the workers proved (or the store's entries say they did): a unit that cut or kept a long
    # text whole says its rule; one from an entry written before that said none of either.
    return Tokenized(done.units, done.totals, choice, failovers, chat, done.totals.cut_rule)


def _chat(
    cfg: JobConfig, tok: LoadedTokenizer, units: list[WorkUnit], log: Callable[[str], None]
) -> tuple[JobConfig, ChatTemplate | None, list[Chat], dict[str, Any] | None]:
    """Conversations' template compiled and checked on the probes and a corpus sample (check_chat),
    with the config the workers render by (every turn's prefixes, where one render found other
    turns); the sample; what the manifest says of it. The config as it was and None for plain text."""
    template = chat_template(cfg, tok)  # conversations only: compiled once, checked, keyed
    records = _chat_records(cfg, units) if cfg.input.chat else []
    chat = check_chat(cfg, template, records)
    if chat is not None:
        if chat.get("spans_differ"):  # the workers render every turn's prefixes too (tokenizer.chat_spans)
            log(
                "[raypack] one render found other assistant turns than prefix renders on "
                f"{chat['spans_differ']}: every conversation's turns by prefix renders"
            )
            cfg = dataclasses.replace(
                cfg, tokenizer=dataclasses.replace(cfg.tokenizer, chat_spans="prefixes")
            )
            template = chat_template(cfg, tok)
        log(f"[raypack] chat template: {chat['template']} ({chat['mask']})")
    return cfg, template, records, chat


def _backend_check(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    units: list[WorkUnit],
    pool: TokenizePool,
    template: ChatTemplate | None,
    records: list[Chat],
) -> Callable[[], Choice]:
    """The backend self-check (raypack.text.backends.choose_backend), to run when asked: fastokens
    on a worker against tokenizers on the probes and a corpus sample (conversations: the template's
    renders, offsets compared too)."""
    if cfg.input.chat:  # ids and character offsets of what the template renders
        sample = partial(render_texts, template, records)
        probe_texts = render_texts(template, [Chat(messages=p) for p in PROBES]) if template else []
        return partial(
            choose_backend,
            cfg.tokenizer.backend,
            tok,
            sample,
            pool.fast_encoder,
            chat=True,
            probe_texts=probe_texts,
        )
    # Where the driver read the ids from the JSON and has not parsed the tokenizer, the reference's
    # side of the check runs on a worker too (whose load parsed it anyway).
    reference = None if tok.parsed else pool.reference_encoder
    return partial(
        choose_backend,
        cfg.tokenizer.backend,
        tok,
        partial(_corpus_sample, units, cfg.storage),
        pool.fast_encoder,
        reference_encoder=reference,
    )


def _ahead(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    version: str | None,
    remembered: Choice | None,
    digests: dict[str, str] | None,
) -> Choice | None:
    """fastokens, "being checked", where the workers may start with it while the driver checks it
    (its encodes go to a worker ahead of the units waiting: the check, ~0.6 s of a 500 MB job,
    would otherwise leave the cores idle); None where the check surely refuses it or its refusal
    must come first."""
    if (
        version is None  # not installed here
        or remembered is not None
        # Not where the check's refusal is an error (tokenizer.backend fastokens), whose one line
        # must leave the previous dataset in place: the check ends before the output is cleared.
        or cfg.tokenizer.backend != "auto"
        # Not into a token store: a job killed before its check ends would leave entries that a
        # later job, finding every unit there, takes without a check (it runs none then). (Asked
        # before the offsets, which need the tokenizer parsed: a store's job may never parse it.)
        or digests is not None
        # Not for conversations with a tokenizer whose offsets do not follow from its ids.
        or (cfg.input.chat and tok.offsets() is None)
    ):
        return None
    return Choice("fastokens", version, "being checked")


def _from_store(passes: Passes, stored: Choice, check: Callable[[], Choice]) -> tuple[Choice, Pass]:
    """Every unit is in the token store under the key of a backend this job would take: the
    reference's, or fastokens' (jobs whose check passed on this tokenizer, backend version and
    settings wrote them: a refused backend's files are discarded, and a job writes into a store only
    after its check). No check is run (~1 s on the driver, before a repack's assign), and the
    workers load no tokenizer (raypack.pipeline.tokenize.pool.tokenize_unit), unless a unit is
    tokenized after all (an entry that was not whole): fastokens' are then checked."""
    done = passes.run(stored, stored=True)
    choice = stored
    if done.written and stored.backend != "tokenizers":
        choice = check()
        if choice.label != stored.label:
            passes.discard(done)
            done = passes.run(choice)
    return choice, done


def _ahead_of_check(
    passes: Passes,
    ahead: Choice,
    check: Callable[[], Choice],
    announce: Callable[[Choice], None],
    log: Callable[[str], None],
) -> tuple[Choice, Pass]:
    """A pass with `ahead` (fastokens) while the driver's check runs in a thread: it stops giving
    out units once the check refuses fastokens or a worker could not load it, and then every unit is
    tokenized again with the check's choice (what the first pass wrote discarded)."""
    with ThreadPoolExecutor(1, thread_name_prefix="raypack-check") as checking:
        checked = checking.submit(check)
        checked.add_done_callback(lambda f: None if f.exception() else announce(f.result()))

        def refused() -> bool:
            if not checked.done():
                return False
            return checked.exception() is not None or checked.result().label != ahead.label

        done = passes.run(ahead, refused)
        try:
            choice = checked.result()  # the check's ConfigError (tokenizer.backend fastokens)
        except BaseException:
            passes.discard(done)
            raise
    if choice.label != ahead.label or done.refused:
        if done.written:
            began = f"{len(done.written)} units tokenized by {ahead.label} before its check"
            log(f"[raypack] {began}: tokenizing again")
        passes.discard(done)
        done = passes.run(choice)
    return choice, done


@dataclass
class Pass:
    """One pass of the stage over every unit, under one backend's keys."""

    units: list[WorkUnit]
    """Every unit, keyed for the pass's backend (its token file named)."""
    totals: Totals
    written: list[WorkUnit]
    """The units whose token files the pass wrote (not found already)."""
    refused: list[str]
    """Why workers refused units untokenized (a pass run ahead of its backend's check: fastokens did
    not load there): the pass must run again."""


class Passes:
    """Passes of the tokenize stage over the job's units (run), and what one wrote taken back
    (discard). The output is cleared before the first unit is given out (ready)."""

    def __init__(
        self,
        cfg: JobConfig,
        tok: LoadedTokenizer,
        units: list[WorkUnit],
        token_dir: str,
        pool: TokenizePool,
        width: int,
        stream: TextIO | None,
        digests: dict[str, str] | None,
        template: ChatTemplate | None,
        clear: Callable[[], None],
    ) -> None:
        self.cfg, self.tok, self.units, self.token_dir, self.pool = cfg, tok, units, token_dir, pool
        self.stream, self.digests, self.template, self.clear = stream, digests, template, clear
        self.runs = max(1, min(len(units), width))
        self.weights = unit_bytes(units)
        # Largest first: the last units to start are the shortest, so workers finish close together
        # (the summaries are folded in any order; nothing downstream depends on it).
        self.order = sorted(range(len(units)), key=lambda i: -self.weights[i])
        self.stored: Choice | None = None
        """The backend under whose keys a token store holds every unit (None: none does)."""
        self.cleared = False

    def keyed(self, choice: Choice) -> list[WorkUnit]:
        """Every unit with its token file named for `choice` (token_files.token_key)."""
        cfg, digests = self.cfg, self.digests
        settings = {
            u.source: token_settings(cfg, self.tok, u.reading, choice, self.template) for u in self.units
        }
        return [
            u.with_token_file(
                self.token_dir,
                token_key(
                    u, settings[u.source], None if digests is None else [digests[f.path] for f in u.files]
                ),
            )
            for u in self.units
        ]

    def run(self, choice: Choice, refused: Callable[[], bool] | None = None, stored: bool = False) -> Pass:
        """Every unit keyed for `choice` and tokenized; with a fast backend, giving out units stops at
        the first whose check found a difference. `refused`: the pass runs ahead of the driver's
        check of its backend, and stops giving out units once that says so or a worker refused a
        unit (its fastokens did not load). `stored`: every unit's token file was found (the workers
        need not load the tokenizer first)."""
        self.ready()
        keyed = self.keyed(choice)
        cfg, weights = self.cfg, self.weights
        totals = Totals(
            shard_runs(weights, self.runs), self.runs, cfg.pack.seq_len, [u.source for u in keyed]
        )
        done = Pass(keyed, totals, [], [])
        progress = Progress("tokenize", len(keyed), "units", sum(weights), self.stream)

        def add(summary: dict[str, Any]) -> None:
            if "refused" in summary:  # untokenized: the pass is refused, and run again
                done.refused.append(str(summary["refused"]))
                return
            totals.add(summary)  # folded as they arrive: no list of every unit's histogram
            progress.advance(1, weights[int(summary["shard"])])
            if not summary["cached"]:
                done.written.append(keyed[int(summary["shard"])])

        def stop() -> bool:
            return bool(totals.failovers or done.refused) or (refused is not None and refused())

        ordered = [keyed[i] for i in self.order]
        self.pool.run(
            ordered, TokenizeShards, choice.backend, add, stop, cfg, not stored, refused is not None
        )
        if progress.done or not done.refused:  # (a pass its workers refused whole did nothing to show)
            progress.close()
        return done

    def discard(self, done: Pass) -> None:
        """Token files a pass wrote that must not reach the output, and the rejects and index files
        its units wrote (each unit writes its own again; a job that stops here leaves neither)."""
        storage = self.cfg.storage
        for unit in done.written:
            remove(unit.token_file, storage)
            remove(cached_rejects_file(unit.token_file), storage)
            remove(cached_metadata_file(unit.token_file), storage)
        for part in ("rejects", "index", join("_staging", "index")):
            remove(join(self.cfg.output.path, part), storage)

    def ready(self) -> None:
        """The output cleared, once, before the first unit is given out; where the driver read the
        tokenizer lazily and a unit must be tokenized, only once tokenizers has parsed it (its
        ConfigError leaves the previous dataset in place): a pool whose workers inherit its preload
        parses it as it loads their state, and says how that went (Preload.checked); elsewhere, or
        for conversations (their template and offsets are the driver's), the driver parses it,
        after putting the workers' load into the runner's hands (a parse holds the GIL: parsed
        first, a 131k BPE would start the load ~0.8 s later)."""
        if self.cleared:
            return
        pool = self.pool
        if (self.stored is None and not self.tok.parsed) and (
            self.cfg.input.chat or pool.preload is None or not pool.preload.checked()
        ):
            if pool.preload is not None:
                pool.preload()
                pool.runner.flush()
            _ = self.tok.tokenizer
        self.clear()
        self.cleared = True


# What a backend is said to have been chosen for, where a token store held every unit under its key.
FOUND_IN_STORE = "every unit found in the token store"


def _stored_choice(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    version: str | None,
    remembered: Choice | None,
    keyed_for: Callable[[Choice], list[WorkUnit]],
    token_dir: str,
) -> Choice | None:
    """The backend under whose keys a token store holds every unit (one listing of it), fastokens'
    first; None where no backend's are all there. tokenizers' only where tokenizer.backend allows
    it (a strict fastokens asks for the check's verdict, its ConfigError included)."""
    requested = cfg.tokenizer.backend
    candidates = []
    if version is not None and remembered is None and requested != "tokenizers":
        candidates.append(Choice("fastokens", version, FOUND_IN_STORE))
    if requested != "fastokens":
        reference = reference_version()
        candidates.append(remembered or Choice("tokenizers", reference, FOUND_IN_STORE))
    names = {info.base_name for info in list_dir(token_dir, cfg.storage)}
    for choice in candidates:
        if all(posixpath.basename(u.token_file) in names for u in keyed_for(choice)):
            return choice
    return None


def check_rejects(cfg: JobConfig, totals: Totals) -> None:
    """JobError when nothing is left to pack, when more input files were lost than
    input.max_lost_files allows, or when more than input.max_reject_ratio of the records is bad
    (rejects count records: a lost file, its rows). rejects/ stays, for the user to look at."""
    documents, rejects, reasons = totals.documents, totals.rejected_records, totals.reasons
    records = documents + rejects
    ratio = rejects / records if records else 0.0
    where = join(cfg.output.path, "rejects")
    if previous.held(cfg.output.path):  # the dataset this job was to replace comes back, rejects/ too
        where = f"{join(cfg.output.path, previous.FAILED_REJECTS)} (the dataset there before is kept)"
    # The records' reasons: not those of documents packed in part or not at all (they stand for none).
    records_by_kind = {k: n for k, n in reasons.items() if not k.startswith(CUT_KINDS)}
    top = reasons_text(records_by_kind, most=REJECT_EXAMPLES)
    if documents == 0 and rejects == 0:
        raise JobError("no documents to pack: the input holds no records")
    if documents == 0:
        advice = reject_advice(records_by_kind, cfg.input.max_document_bytes)
        raise JobError(f"no documents to pack: {rejects:,} records rejected: {top}. See {where}: {advice}")
    if totals.lost_files > cfg.input.max_lost_files:
        raise JobError(
            f"{totals.lost_files:,} input file{'s' if totals.lost_files != 1 else ''} could not be read "
            "whole (unreadable, or no readable text "
            f"column), over input.max_lost_files ({cfg.input.max_lost_files:,}); rejects by reason: {top}. "
            f"See {where} for each file, or allow them with input.max_lost_files"
        )
    if ratio > cfg.input.max_reject_ratio:
        raise JobError(
            f"{rejects:,} of {records:,} records rejected ({ratio:.2%}), over input.max_reject_ratio "
            f"({cfg.input.max_reject_ratio:.2%}): {top}. See {where}: "
            f"{reject_advice(records_by_kind, cfg.input.max_document_bytes)}; or raise input.max_reject_ratio"
        )


def _chat_records(cfg: JobConfig, units: list[WorkUnit]) -> list[Chat]:
    """The first records of up to SAMPLE_UNITS work units spread over the corpus: from each, up to
    CHAT_SAMPLE of them and SAMPLE_CHARS / 4 characters of content (one at least)."""
    records: list[Chat] = []
    for unit in _sample_units(units):
        taken = 0
        for batch in read_unit(unit, CHAT_SAMPLE, cfg.storage):
            for record in batch.texts[:CHAT_SAMPLE]:
                if taken and taken + len(record) > SAMPLE_CHARS // 4:
                    break
                records.append(record)
                taken += len(record)
            break
    return records


def unit_bytes(units: list[WorkUnit]) -> list[int]:
    """Input bytes of each work unit: WorkUnit.size, but a Parquet unit's share of its file (its
    row groups' sizes are not kept)."""
    per_file: Counter[str] = Counter(u.relpath for u in units)
    return [
        u.size // per_file[u.relpath] if u.shard.split and u.reading.format == "parquet" else u.size
        for u in units
    ]


def _sample_units(units: list[WorkUnit]) -> list[WorkUnit]:
    """Up to SAMPLE_UNITS work units spread evenly over the corpus, first and last included."""
    if not units:
        return []
    picks = sorted({round(k * (len(units) - 1) / max(SAMPLE_UNITS - 1, 1)) for k in range(SAMPLE_UNITS)})
    return [units[i] for i in picks]


def _corpus_sample(units: list[WorkUnit], storage: Any = None) -> list[str]:
    """Texts of the corpus for the backend self-check."""
    texts: list[str] = []
    for unit in _sample_units(units):
        taken = 0
        for batch in read_unit(unit, 64, storage):
            for text in batch.texts:
                if taken >= SAMPLE_CHARS:
                    break
                texts.append(text[: SAMPLE_CHARS - taken])
                taken += len(texts[-1])
            if taken >= SAMPLE_CHARS:
                break
    return texts
