"""The dataset of ``shardload bench formats``: seeded samples and their check digests (pure).

Every sample is a 1-D float32 array. Fixed length: every sample has ``sample_bytes // 4``
values. Variable length: lengths are drawn uniformly from ``[L/4, 7L/4]`` (mean ``L``) with a
seeded generator, so two runs with the same seed write the same bytes. Values are multiples of
0.25 in ``[0, 1024)``: moderately compressible, as real measurements often are (random
mantissas would make every compressor a pure cost).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import xxhash

DTYPE = np.dtype("float32")


class BenchData(NamedTuple):
    """All samples of one dataset, concatenated (``values``) with their bounds (``offsets``).

    ``hashes[i]`` is the XXH3-64 digest of sample ``i``'s bytes: what every read is checked
    against.
    """

    values: np.ndarray  # float32, (offsets[-1],)
    offsets: np.ndarray  # int64, (num_samples + 1,)
    hashes: np.ndarray  # uint64, (num_samples,)
    fixed_length: bool

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    @property
    def sample_len(self) -> int:
        """Values per sample (fixed length only)."""
        if not self.fixed_length:
            raise ValueError("a variable-length dataset has no single sample length")
        return int(self.offsets[1] - self.offsets[0]) if self.num_samples else 0

    def sample(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def stacked(self) -> np.ndarray:
        """The fixed-length samples as one ``(num_samples, sample_len)`` view."""
        return self.values.reshape(self.num_samples, self.sample_len)


def plan_lengths(
    num_samples: int, sample_bytes: int, *, fixed_length: bool, seed: int
) -> np.ndarray:
    """Values per sample: ``sample_bytes // 4`` each, or seeded uniform lengths of that mean.

    >>> plan_lengths(3, 16, fixed_length=True, seed=0).tolist()
    [4, 4, 4]
    >>> bool((plan_lengths(100, 64, fixed_length=False, seed=0) >= 4).all())
    True
    """
    if num_samples < 1:
        raise ValueError(f"--samples must be >= 1, got {num_samples}")
    mean = sample_bytes // DTYPE.itemsize
    if mean < 1:
        raise ValueError(f"--sample-bytes must be >= {DTYPE.itemsize}, got {sample_bytes}")
    if fixed_length:
        return np.full(num_samples, mean, dtype=np.int64)
    rng = np.random.default_rng([seed, 1])
    low = max(1, mean // 4)
    return rng.integers(low, 2 * mean - low + 1, size=num_samples, dtype=np.int64)


def sample_digest(sample: np.ndarray) -> int:
    """XXH3-64 of a sample's float32 bytes (the check every benchmark read passes)."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(sample, dtype=DTYPE).data)


def make_data(num_samples: int, sample_bytes: int, *, fixed_length: bool, seed: int) -> BenchData:
    """Generate the dataset in memory (``num_samples * sample_bytes`` bytes on average)."""
    lengths = plan_lengths(num_samples, sample_bytes, fixed_length=fixed_length, seed=seed)
    offsets = np.zeros(num_samples + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rng = np.random.default_rng([seed, 2, int(fixed_length)])
    values = rng.integers(0, 4096, size=int(offsets[-1]), dtype=np.int16).astype(DTYPE)
    values *= 0.25
    hashes = np.fromiter(
        (sample_digest(values[offsets[i] : offsets[i + 1]]) for i in range(num_samples)),
        dtype=np.uint64,
        count=num_samples,
    )
    return BenchData(values, offsets, hashes, fixed_length)
