"""A max segment tree over the values 0..n-1, where a leaf holds its own index when "present", else -1.

This is the structure of Ding et al. (2024) for best-fit: leaves are remaining capacities, a leaf is
present when some open pack has exactly that much room, and each inner node holds the largest present
capacity below it. "Smallest present capacity >= x" (best fit) and "largest present value <= x"
(greedy fill) are then one root-to-leaf walk each: O(log n), with no per-pack work.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._jit import njit

__all__ = ["tree_first_ge", "tree_last_le", "tree_new", "tree_set"]


@njit
def tree_new(n):
    size = 1
    while size < n:
        size *= 2
    return np.full(2 * size, -1, dtype=np.int64)


@njit
def tree_set(tree, value, present):
    size = len(tree) // 2
    node = size + value
    tree[node] = value if present else -1
    node //= 2
    while node >= 1:
        left = tree[2 * node]
        right = tree[2 * node + 1]
        tree[node] = left if left > right else right
        node //= 2


@njit
def tree_first_ge(tree, x):
    """Smallest present value >= x, or -1. The left child is tried first: it holds the smaller values."""
    if x < 0:
        x = 0  # absent nodes hold -1, so a negative bound would walk into them
    if tree[1] < x:
        return -1
    size = len(tree) // 2
    node = 1
    while node < size:
        if tree[2 * node] >= x:
            node = 2 * node
        else:
            node = 2 * node + 1
    return node - size


@njit
def tree_last_le(tree, x):
    """Largest present value <= x, or -1."""
    size = len(tree) // 2
    if x < 0:
        return -1
    if x >= size:
        return tree[1]
    node = size + x
    if tree[node] >= 0:
        return x
    # Climb until a left sibling holds something; its max is the answer, since every value in it is < x.
    while node > 1:
        if node % 2 == 1 and tree[node - 1] >= 0:
            return tree[node - 1]
        node //= 2
    return -1
