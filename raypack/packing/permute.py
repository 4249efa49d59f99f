"""A seeded permutation of pack ids that any worker can evaluate alone, in O(1) memory.

Packers that sort by length emit packs in length order (bfd's first packs are all full-length chunks);
training on that order biases the model. Shuffling pack ids with a stored permutation would cost
8 bytes per pack on every worker (32 MB for 4M packs); instead we use a keyed Feistel network, a
bijection on [0, 2^b), and cycle-walk the values that land at or past num_packs (the domain is at most
4 × num_packs, so ~1.3 rounds of walking on average). Keys come from blake2b of the seed, so the
permutation is the same on every machine and numpy version.
"""

from __future__ import annotations

import hashlib

import numpy as np

from raypack.packing._jit import njit

__all__ = ["PackPermutation"]

_ROUNDS = 6
# The round function is splitmix64's finalizer on (half-block + round key): every output bit depends on
# every input bit. A weaker mix, such as (x ^ key) * odd, h ^= h >> 29, keeps an XOR of x with a
# constant in the few low bits a small domain uses: the network is then affine, and for 32 packs the
# identity after cycle walking.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class PackPermutation:
    """`perm(ids)`: the shuffled id of every pack id in `ids` (a bijection of 0..num_packs-1)."""

    def __init__(self, num_packs: int, seed: int) -> None:
        if num_packs < 0:
            raise ValueError(f"num_packs must be >= 0, got {num_packs}")
        self.num_packs = num_packs
        bits = max(2, int(num_packs - 1).bit_length()) if num_packs > 1 else 2
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = np.array(
            [
                int.from_bytes(hashlib.blake2b(f"raypack:{seed}:{r}".encode(), digest_size=8).digest())
                for r in range(_ROUNDS)
            ],
            dtype=np.uint64,
        )

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_packs):
            raise ValueError(f"pack ids must be in 0..{self.num_packs - 1}")
        y = _permute(ids.astype(np.uint64), self._keys, self._half, self._mask, np.uint64(self.num_packs))
        return y.astype(ids.dtype)


@njit
def _permute(ids, keys, half, mask, n):
    """Each id through the Feistel network, again while it lands at or past n (cycle walking: stays
    inside [0, n), still a bijection). Numba, an id at a time: ~1 ms of a 2-core 500 MB job's
    assign task, where numpy, a pass per round and per walk over the ids still walking, takes
    0.36 s. uint64 throughout (numba turns uint64 mixed with int64 into float64)."""
    out = np.empty(ids.shape[0], dtype=np.uint64)
    for i in range(ids.shape[0]):
        y = ids[i]
        while True:
            left, right = y >> half, y & mask
            for r in range(keys.shape[0]):
                # splitmix64's finalizer on (half-block + round key); multiplications wrap mod 2^64.
                z = right + keys[r]
                z = (z ^ (z >> np.uint64(30))) * _M1
                z = (z ^ (z >> np.uint64(27))) * _M2
                z ^= z >> np.uint64(31)
                left, right = right, left ^ (z & mask)
            y = (left << half) | right
            if y < n:
                break
        out[i] = y
    return out
