"""`PackedDataset`: a torch IterableDataset over one data-parallel rank's batches of a packed dataset,
for torch's DataLoader and torchdata's StatefulDataLoader (needs PyTorch: pip install 'raypack[torch]').

    ds = PackedDataset("s3://bucket/packed/", batch_size=8, rank=rank, world_size=world, seed=epoch)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)   # batches come ready-made
    for batch in loader:
        out = model(batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                    attention_mask=block_causal_mask(batch["document_ids"], model.dtype))
    state = loader.state_dict()          # ... later: loader.load_state_dict(state) resumes mid-epoch

The rank's steps are raypack.reader.iter_batches' (same seed, same order, same fields, as tensors).
With DataLoader workers, worker w of W yields steps w, w + W, ... and skips the others without
reading them; the DataLoader takes one batch from each worker in turn, so batches arrive in step
order: no step twice, none skipped, whatever num_workers is. The state of a worker is the next step
it would yield (plus the settings, checked on load): a resumed loader with the same num_workers
continues every worker where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from raypack.config import StorageConfig
from raypack.reader import _steps, _torch_converter, check_args

__all__ = ["PackedDataset"]


class PackedDataset(IterableDataset[dict[str, Any]]):
    def __init__(
        self,
        path: str,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        *,
        last_batch: str = "wrap",
        storage: StorageConfig | None = None,
    ) -> None:
        check_args(batch_size, rank, world_size, last_batch)
        self.path, self.batch_size, self.rank, self.world_size = path, batch_size, rank, world_size
        self.seed, self.last_batch, self.storage = seed, last_batch, storage
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
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # A fresh epoch starts this worker at its first step; a resumed one where its state says.
        start = self._resume if self._resume is not None else worker
        self._resume = None
        self._next = start
        convert = _torch_converter()
        for batch in _steps(
            self.path,
            self.batch_size,
            self.rank,
            self.world_size,
            self.seed,
            start,
            workers,
            self.last_batch,
            self.storage,
        ):
            self._next += workers  # before yielding: a state taken with this batch resumes after it
            yield convert(batch)
        self._next = None

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: the step it yields next (None before it started: from the start)."""
        return {**self._settings(), "next_step": self._next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mismatched = {k: (state.get(k), v) for k, v in self._settings().items() if state.get(k) != v}
        if mismatched:
            raise ValueError(f"the state was saved with other settings (saved, now): {mismatched}")
        self._resume = state["next_step"]
