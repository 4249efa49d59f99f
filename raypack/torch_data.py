"""`PackedDataset`: a torch IterableDataset over one data-parallel rank's batches of a packed dataset,
for torch's DataLoader and torchdata's StatefulDataLoader (needs PyTorch: pip install 'raypack[torch]').

    ds = PackedDataset("s3://bucket/packed/", batch_size=8, rank=rank, world_size=world, seed=epoch)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)   # batches come ready-made
    for batch in loader:
        out = model(batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                    attention_mask=block_causal_mask(batch["document_ids"], model.dtype))
    state = loader.state_dict()          # ... later: loader.load_state_dict(state) resumes mid-epoch

The rank's steps are raypack.reader.iter_batches' (same seed, same order, same fields, as tensors;
`balance="attention"` balances each step's ranks' attention cost as it does there).
With DataLoader workers, worker w of W yields steps w, w + W, ... and skips the others; the
DataLoader takes one batch from each worker in turn, so batches arrive in step order: no step
twice, none skipped, whatever num_workers is. Consecutive steps share row groups, so the workers
share them too (raypack.shared_groups): each row group is read and decoded once per epoch, by the
first worker that needs it, not once per worker.

`tokens_per_batch=T` (instead of batch_size) and `curriculum` give batches of T tokens whose
sequence length follows a schedule, as iter_batches does (raypack.reader, "Variable sequence
length"); the state records them, and a state of another T resumes elastically.

Version. The dataset is pinned when the PackedDataset is made: a rebuild's root is resolved through
LATEST once, in the main process, and every worker and epoch reads that version. The state of a
worker is the next step it would yield, the settings, and the version (the manifest's sha256);
loading a state saved on another version (a rebuild committed in between) is a ValueError, unless
`follow_latest=True` says to go on from that step on the version pinned now, knowingly.

Elastic resume (another world size or batch size): a state loads only into the settings it was
saved with; a job restarted on other ranks makes its PackedDataset with `resume=` any one old
rank's state (the StatefulDataLoader's state_dict(), or this dataset's), and a fresh loader:

    ds = PackedDataset(path, batch_size=16, rank=rank, world_size=2, seed=epoch, resume=saved_at_4)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)

The new ranks share what the old ones had not yielded (raypack.reader, "Resume"); its own state
records the runs before it, so it resumes (or resumes elastically) again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

try:
    from torch.utils.data import IterableDataset, get_worker_info
except ModuleNotFoundError as e:  # only this module needs torch (~750 MB, CPU build): an extra
    if e.name != "torch":
        raise
    raise ModuleNotFoundError("raypack.torch_data needs PyTorch: pip install 'raypack[torch]'") from None

from raypack.balance import ATTENTION_PER_TOKEN
from raypack.config import StorageConfig
from raypack.packing.curriculum import Curriculum
from raypack.reader import (
    Plan,
    balance_of,
    batching_of,
    check_args,
    pin,
    resume_of,
    torch_converter,
    with_loss_weights,
)
from raypack.shared_groups import SharedGroups

__all__ = ["PackedDataset"]


class PackedDataset(IterableDataset[dict[str, Any]]):
    def __init__(
        self,
        path: str,
        batch_size: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        *,
        last_batch: str = "wrap",
        follow_latest: bool = False,
        storage: StorageConfig | None = None,
        resume: dict[str, Any] | None = None,
        loss_weights: str | None = None,
        balance: str | None = None,
        balance_per_token: float = ATTENTION_PER_TOKEN,
        tokens_per_batch: int | None = None,
        curriculum: str | Curriculum = "natural",
    ) -> None:
        check_args(batch_size, rank, world_size, last_batch, loss_weights)
        # tokens_per_batch: batches of a fixed token count, their length by the curriculum (raypack.reader).
        self.batching = batching_of(batch_size, tokens_per_batch, curriculum, last_batch)
        self.balance = balance_of(balance, balance_per_token, tokens_per_batch)
        self.loss_weights = loss_weights
        self.path, self.batch_size, self.rank, self.world_size = path, batch_size, rank, world_size
        self.seed, self.last_batch, self.storage = seed, last_batch, storage
        self.follow_latest = follow_latest
        self.pinned = pin(path, storage)
        # An elastic resume: a rank's state from a run of this epoch at another world or batch size.
        self.resume = resume_of(resume, self.pinned, follow_latest) if resume is not None else None
        if self.resume is not None:
            self.resume.check_seed(seed)
        self._token = uuid.uuid4().hex  # names this dataset's shared directories (with the epoch's)
        self._epochs = 0
        self._resume: int | None = None  # the step this worker resumes at (load_state_dict)
        self._next: int | None = None  # the next step this worker yields, while iterating

    def _settings(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "seed": self.seed,
            "last_batch": self.last_batch,
            "balance": self.balance.to_state() if self.balance is not None else None,
            "resumed_from": self.resume.to_state() if self.resume is not None else None,
            **self.batching.state(),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # A fresh epoch starts this worker at its first step; a resumed one where its state says.
        start = self._resume if self._resume is not None else worker
        self._resume = None
        self._next = start
        self._epochs += 1
        plan = Plan.of(
            self.pinned,
            self.batching,
            self.rank,
            self.world_size,
            self.seed,
            self.last_batch,
            self.storage,
            self.resume,
            self.balance,
        )
        shared = None
        if info is not None and workers > 1:
            # Every worker of one DataLoader iterator has the same base seed (its seed - its id), and
            # iterates its copy of this dataset the same number of times.
            token = f"{self._token}-{info.seed - info.id}-{self._epochs}"
            # Where the loader's workers go on from: exact on a fresh epoch (worker u at step u); after a
            # resume, an estimate from this worker's own start (raypack.shared_groups).
            first = max(0, start - (workers - 1))
            shared = SharedGroups(token, worker, workers, start, first, plan.touches(first), plan.read)
        convert = torch_converter()
        try:
            step = start
            for batch in plan.steps(start, workers, shared.load if shared is not None else None):
                if shared is not None:
                    shared.done(step)
                self._next += workers  # before yielding: a state taken with this batch resumes after it
                step += workers
                yield convert(with_loss_weights(batch, self.loss_weights))
        finally:
            if shared is not None:
                shared.close()
        self._next = None

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: the step it yields next (None before it started: from the start),
        and the version it reads."""
        info = get_worker_info()
        return {
            **self._settings(),
            "next_step": self._next,
            "dataset": self.pinned.path,
            "manifest_sha256": self.pinned.sha256,
            "workers": info.num_workers if info is not None else 1,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where `state` (this dataset's state_dict(), as StatefulDataLoader hands it over)
        stands. A state of the same settings goes on exactly; one of another world size, batch size
        or rank (or of a resumed run), loaded before the first batch in the loader's own process,
        becomes an elastic resume, as `resume=` would (what a framework's checkpointer does: make the
        loader, then load_state_dict). ValueError for anything else."""
        # The path may differ: a state saved on a rebuild's root resumes on the version it read
        # (state["dataset"]), which the manifest's sha256 identifies, not the path it was given.
        mismatched = {
            k: (state.get(k), v) for k, v in self._settings().items() if k != "path" and state.get(k) != v
        }
        if mismatched and self._elastic(state, set(mismatched)):
            return
        if mismatched:
            elastic = {"world_size", "batch_size"} & set(mismatched)
            hint = ""
            if self.resume is not None and "resumed_from" in mismatched:
                hint = (
                    "; this PackedDataset resumes an epoch (resume=): start its loader afresh, without "
                    "load_state_dict, or load a state its own run saved"
                )
            elif "resumed_from" in mismatched:
                hint = (
                    "; the state is of a resumed run: make the PackedDataset with resume= that state "
                    "(it holds the runs before it) and a fresh loader"
                )
            elif elastic:
                hint = (
                    f"; to go on at another {' and '.join(sorted(elastic))}, make the PackedDataset with "
                    "resume=state (an elastic resume) and a fresh loader"
                )
            raise ValueError(f"the state was saved with other settings (saved, now): {mismatched}{hint}")
        saved = state.get("manifest_sha256")
        if saved != self.pinned.sha256 and not self.follow_latest:
            raise ValueError(
                f"the state was saved reading {state.get('dataset', '(an unrecorded version)')} "
                f"(manifest {str(saved)[:12]}), and {self.path} now holds {self.pinned.path} "
                f"(manifest {self.pinned.sha256[:12]}): a rebuild committed since. To finish the epoch "
                f"on the data it began, make the PackedDataset on {state.get('dataset', 'that version')}; "
                "to go on from the same step on the new version, pass follow_latest=True"
            )
        self._resume = state["next_step"]

    def _elastic(self, state: dict[str, Any], mismatched: set[str]) -> bool:
        """Take `state` as an elastic resume where it can be one (load_state_dict): True when taken.
        Only in the loader's own process (num_workers=0): a worker's state says where that worker
        stands, not its rank, so a loader with workers resumes elastically with `resume=` its whole
        state_dict()."""
        if not mismatched <= {
            "world_size",
            "batch_size",
            "tokens_per_batch",
            "rank",
            "resumed_from",
            "balance",
        }:
            return False  # another seed, last_batch: never the same epoch
        if self.resume is not None or self._epochs or get_worker_info() is not None:
            return False
        if int(state.get("workers", 1)) > 1:
            raise ValueError(
                "the state is one DataLoader worker's of a loader with several: it says where that "
                "worker stands, not its rank; make the PackedDataset with resume= the loader's whole "
                "state_dict() (an elastic resume) and a fresh loader"
            )
        resume = resume_of(state, self.pinned, self.follow_latest)
        resume.check_seed(self.seed)
        self.resume, self._resume = resume, None
        return True
