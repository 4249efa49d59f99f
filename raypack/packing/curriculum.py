"""Which bucket (sequence length) each training step reads: the variable sequence length curricula
of Pouransari et al., "Dataset Decomposition" (NeurIPS 2024), section 3.2, as OLMo-core names them
(olmo_core.data.numpy_dataset: VSLNaturalCurriculum, VSLGrowP2Curriculum, VSLGrowLinearCurriculum).

Every step's batch holds the same number of tokens whatever its length (the reader's
tokens_per_batch), so bucket b gives steps[b] batches, and a schedule is an order of that multiset:
each bucket index appears steps[b] times, nothing else. Pure: counts in, bucket indexes out; the
seeded shuffles come from `permute`, the caller's (the reader's: the same on every rank, so all
ranks read one length a step).

- natural (the paper's "Uniform"): one seeded shuffle of the whole multiset. Step by step, that
  draws the next batch's bucket with probability by the batches (so the tokens) each bucket has
  left, the paper's mixing.
- grow_p2, grow_linear: `num_cycles` cycles, each bucket's batches spread over them as evenly as
  they divide (OLMo-core's divide_into_buckets); a cycle is B sub-cycles (B buckets, shortest
  first), in which bucket i's share of the cycle's batches has odds 2^(k-1) (Grow-P2) or k
  (Grow-Linear), k rising by one a sub-cycle for the longest bucket and falling for the shortest
  (OLMo-core's _get_bucket_odds_for_cycle), so each cycle moves from short sequences to long. A
  sub-cycle's batches are shuffled; the first step is moved to a batch of the longest bucket (an
  out-of-memory error shows at once), as OLMo-core does.

Differences from OLMo-core, on purpose: it drops a bucket's batches past a multiple of num_cycles
(and, `balanced`, down to the smallest bucket's) where these keep every batch (the counts of a
cycle then differ by one); its shuffles are numpy's PCG64 where these are the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CURRICULA", "Curriculum", "bucket_odds", "cycle_counts", "schedule"]

CURRICULA = ("natural", "grow_p2", "grow_linear")

Permute = Callable[[int, tuple[object, ...]], np.ndarray]
"""(n, parts) -> a seeded permutation of range(n), its seed made of the caller's and `parts`."""


@dataclass(frozen=True, slots=True)
class Curriculum:
    """A schedule's kind (CURRICULA) and, for the growing ones, its cycles."""

    name: str = "natural"
    num_cycles: int = 8

    def __post_init__(self) -> None:
        if self.name not in CURRICULA:
            raise ValueError(f"curriculum must be one of {', '.join(CURRICULA)}, got {self.name!r}")
        if isinstance(self.num_cycles, bool) or not isinstance(self.num_cycles, int) or self.num_cycles < 1:
            raise ValueError(f"num_cycles must be an int >= 1, got {self.num_cycles!r}")

    @classmethod
    def of(cls, value: str | Curriculum) -> Curriculum:
        return value if isinstance(value, Curriculum) else cls(value)


def bucket_odds(name: str, bucket: int, buckets: int) -> list[int]:
    """Bucket `bucket`'s odds (of `buckets`, 0 the shortest) in each sub-cycle of a cycle."""
    start = buckets - bucket
    odds = []
    for sub in range(buckets):
        k = start + sub if start + sub <= buckets else start - (start + sub) % buckets
        odds.append(2 ** (k - 1) if name == "grow_p2" else k)
    return odds


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` counts differing by at most one, the larger first."""
    out = []
    for left in range(parts, 0, -1):
        take = -(-total // left)
        out.append(take)
        total -= take
    return out


def _by_odds(total: int, odds: Sequence[int]) -> list[int]:
    """`total` shared by `odds`, each share rounded (Python's round, as OLMo-core), the difference
    to make `total` taken from or given to the last shares."""
    weight = sum(odds)
    out = [round(o / weight * total) for o in odds]
    diff = total - sum(out)
    k = len(out) - 1
    while diff < 0:  # rounding gave too many: take them back from the end
        take = min(out[k], -diff)
        out[k] -= take
        diff += take
        k -= 1
    out[-1] += diff
    return out


def cycle_counts(name: str, steps: Sequence[int], num_cycles: int) -> np.ndarray:
    """int64[num_cycles, B sub-cycles, B buckets]: batches of each bucket in each sub-cycle."""
    b = len(steps)
    counts = np.zeros((num_cycles, b, b), dtype=np.int64)
    for bucket, total in enumerate(steps):
        odds = bucket_odds(name, bucket, b)
        for cycle, in_cycle in enumerate(_split(int(total), num_cycles)):
            counts[cycle, :, bucket] = _by_odds(in_cycle, odds)
    return counts


def schedule(steps: Sequence[int], permute: Permute, curriculum: Curriculum | None = None) -> np.ndarray:
    """The bucket index of every step (the module's docstring), buckets in ascending length."""
    curriculum = curriculum or Curriculum()
    plan = np.repeat(np.arange(len(steps)), steps)
    if curriculum.name == "natural" or len(plan) < 2:
        return plan[permute(len(plan), ())] if len(plan) > 1 else plan
    counts = cycle_counts(curriculum.name, steps, curriculum.num_cycles)
    parts = []
    for cycle in range(curriculum.num_cycles):
        for sub in range(len(steps)):
            batch = np.repeat(np.arange(len(steps)), counts[cycle, sub])
            parts.append(batch[permute(len(batch), (cycle, sub))] if len(batch) > 1 else batch)
    order = np.concatenate(parts)
    longest = np.flatnonzero(order == order.max())[0]
    order[[0, longest]] = order[[longest, 0]]
    return order
