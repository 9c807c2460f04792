"""A seeded permutation of ``range(n)`` evaluated one index at a time, in O(1) memory: a 4-round Feistel network
over the smallest even power of two >= n, cycle-walked back into range (at most a few steps on average).

The loader uses it for datasets of more than :data:`TABLE_LIMIT` samples, where ``torch.randperm`` would hold
8 bytes per sample per rank (67 MB for the 8.4 M windows of a 4 GB corpus at context 256).
"""

from __future__ import annotations

TABLE_LIMIT = 1 << 20
"""Up to this many samples, a materialised ``torch.randperm`` (8 MB at most); above it, :class:`Feistel`."""
_MASK = (1 << 64) - 1
_ROUNDS = 4


def mix64(z: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``z``."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Feistel:
    """``perm(i)`` for i in ``range(n)``: a bijection of ``range(n)`` fixed by ``key``."""

    def __init__(self, n: int, key: int) -> None:
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        self.n = n
        self.keys = [mix64(key * _ROUNDS + r) for r in range(_ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (mix64(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} of a permutation of {self.n}")
        x = self._encrypt(i)
        while x >= self.n:  # cycle-walk: the domain is < 4n, so this ends after a few steps
            x = self._encrypt(x)
        return x
