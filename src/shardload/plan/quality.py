"""Shuffle quality: how well batches mix rows, against a uniform shuffle (pure numpy).

Every figure takes the batches of an epoch as arrays of global rows (a loader's ``"index"``,
or a plan's :func:`~shardload.plan.epoch.iter_rank_batches`, all ranks together) and compares
them with what a uniform permutation of the same rows cut into batches of the same sizes gives
*in expectation*, so 1.0 means "as good as uniform" for every ratio:

- :func:`chunks_per_batch`: mean number of distinct chunks among the rows of a full batch
  (:func:`uniform_chunks_per_batch` is the uniform expectation);
- :func:`vif`: the variance over full batches of the batch mean of a per-row feature, divided
  by ``Var(f) / B`` (variance inflation; 1.0 for uniform, about ``B / chunks per batch`` for a
  feature constant within a chunk). ``f = row / N`` gives *VIF_pos*; an AR(1) series along
  storage order (:func:`ar1_series`, correlation length 200 rows) gives *VIF_ar*;
- :func:`recurrence`: how much more often than uniform two rows that share a batch in one
  epoch share one in the next;
- :func:`pair_excess`: P(two rows of one chunk share a batch) divided by uniform's.

>>> rows = np.random.default_rng(0).permutation(4096)
>>> batches = np.split(rows, 16)
>>> chunk_of = np.arange(4096) // 256
>>> round(chunks_per_batch(batches, chunk_of) / uniform_chunks_per_batch(chunk_of, 256), 2)
1.0
>>> seq = np.split(np.arange(4096), 16)  # storage order: one chunk per batch
>>> chunks_per_batch(seq, chunk_of), round(pair_excess(seq, chunk_of), 1)
(1.0, 16.1)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "AR_CORRELATION_ROWS",
    "ar1_series",
    "chunks_per_batch",
    "pair_excess",
    "quality",
    "recurrence",
    "shuffle_buffer_batches",
    "uniform_batches",
    "uniform_chunks_per_batch",
    "vif",
]

#: Correlation length (rows) of the synthetic AR(1) feature of VIF_ar.
AR_CORRELATION_ROWS = 200


def _full(batches: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The batches of the most common (largest) size: short last batches are left out."""
    if not batches:
        return []
    b = max(len(x) for x in batches)
    return [np.asarray(x, np.int64) for x in batches if len(x) == b]


def chunks_per_batch(batches: Sequence[np.ndarray], chunk_of: np.ndarray) -> float:
    """Mean distinct chunks among the rows of a full batch (``chunk_of[row]``: its chunk)."""
    full = _full(batches)
    if not full:
        return float("nan")
    c = chunk_of[np.stack(full)]
    c.sort(axis=1)
    return float(1 + (c[:, 1:] != c[:, :-1]).sum(axis=1).mean())


def uniform_chunks_per_batch(chunk_of: np.ndarray, batch_size: int) -> float:
    """Expected distinct chunks in a batch of ``batch_size`` rows drawn without replacement
    from all rows (hypergeometric: a chunk of ``s`` of ``N`` rows is missed with probability
    ``C(N - s, B) / C(N, B)``).

    >>> round(uniform_chunks_per_batch(np.repeat(np.arange(64), 4096), 256), 1)
    62.9
    """
    sizes = np.bincount(np.asarray(chunk_of, np.int64))
    sizes = sizes[sizes > 0]
    n, b = int(sizes.sum()), int(batch_size)
    j = np.arange(b, dtype=np.float64)
    # log C(N - s, B) - log C(N, B) = sum_j log((N - s - j) / (N - j)), for N - s >= B
    miss = np.zeros(len(sizes))
    ok = n - sizes >= b
    for i in np.flatnonzero(ok):
        miss[i] = np.exp(np.log1p(-sizes[i] / (n - j)).sum())
    return float((1 - miss).sum())


def vif(batches: Sequence[np.ndarray], values: np.ndarray) -> float:
    """Variance over full batches of the batch mean of ``values[row]``, over ``Var / B``.

    ``Var`` is the variance of ``values`` over the rows the batches hold. A uniform shuffle
    gives ``(N - B) / (N - 1)``, about 1.
    """
    full = _full(batches)
    if len(full) < 2:
        return float("nan")
    idx = np.stack(full)
    rows = np.concatenate(batches)
    var = float(np.var(values[rows]))
    if var == 0:
        return float("nan")
    means = values[idx].mean(axis=1)
    return float(np.var(means, ddof=1) / (var / idx.shape[1]))


def ar1_series(n: int, *, corr_rows: float = AR_CORRELATION_ROWS, seed: int = 0) -> np.ndarray:
    """A stationary AR(1) series of ``n`` values, unit variance, ``corr(x_t, x_{t+d}) =
    exp(-d / corr_rows)``: a feature that drifts along storage order (time, season, region)."""
    phi = float(np.exp(-1.0 / corr_rows))
    eps = np.random.default_rng(seed).standard_normal(n)
    eps[1:] *= np.sqrt(1 - phi * phi)
    # x_t = phi x_{t-1} + eps_t, as a scan over blocks (a Python loop over n would be slow)
    out = np.empty(n)
    block = 1024
    carry = 0.0
    powers = phi ** np.arange(block + 1)
    for a in range(0, n, block):
        e = eps[a : a + block]
        k = len(e)
        # within the block: x_i = sum_{j<=i} phi^(i-j) e_j + phi^(i+1) carry, via a cumsum of
        # e_j / phi^j (phi^-1024 stays moderate, so float64 keeps it exact enough)
        scaled = np.cumsum(e / powers[:k])
        out[a : a + k] = scaled * powers[:k] + powers[1 : k + 1] * carry
        carry = out[a + k - 1]
    return out


def _pair_count(counts: np.ndarray) -> int:
    counts = counts.astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())


def _uniform_pair_rate(batches: Sequence[np.ndarray]) -> float:
    """P(a given pair of the yielded rows shares a batch) under a uniform shuffle."""
    sizes = np.array([len(b) for b in batches], np.int64)
    n = int(sizes.sum())
    return _pair_count(sizes) / (n * (n - 1) / 2) if n > 1 else float("nan")


def recurrence(epoch_a: Sequence[np.ndarray], epoch_b: Sequence[np.ndarray]) -> float:
    """How much more often than uniform two rows sharing a batch of ``epoch_a`` share one of
    ``epoch_b`` (rows of ``epoch_a`` missing from ``epoch_b`` never do)."""
    rows_b = np.concatenate(epoch_b)
    top = int(max(np.concatenate(epoch_a).max(), rows_b.max())) + 1
    label = np.full(top, -1, np.int64)
    label[rows_b] = np.repeat(np.arange(len(epoch_b)), [len(b) for b in epoch_b])
    a_id = np.repeat(np.arange(len(epoch_a)), [len(b) for b in epoch_a])
    lab = label[np.concatenate(epoch_a)]
    keep = lab >= 0
    key = a_id[keep] * len(epoch_b) + lab[keep]
    shared = _pair_count(np.unique(key, return_counts=True)[1])
    pairs = _pair_count(np.array([len(b) for b in epoch_a]))
    return (shared / pairs) / _uniform_pair_rate(epoch_b) if pairs else float("nan")


def pair_excess(batches: Sequence[np.ndarray], chunk_of: np.ndarray) -> float:
    """P(two rows of one chunk share a batch) over uniform's (the rows the batches hold)."""
    rows = np.concatenate(batches)
    chunks = chunk_of[rows]
    b_id = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
    k = int(chunks.max()) + 1
    shared = _pair_count(np.unique(b_id * k + chunks, return_counts=True)[1])
    same_chunk = _pair_count(np.bincount(chunks))
    if same_chunk == 0:
        return float("nan")
    return (shared / same_chunk) / _uniform_pair_rate(batches)


def quality(
    epochs: Sequence[Sequence[np.ndarray]], chunk_of: np.ndarray, *, seed: int = 0
) -> dict[str, float]:
    """The five figures for one or two consecutive epochs of batches (recurrence needs two).

    ``chunk_of[row]`` is the storage chunk of every row of the store (``len`` = N).
    """
    n = len(chunk_of)
    first = epochs[0]
    b = max(len(x) for x in first)
    cpb = chunks_per_batch(first, chunk_of)
    full = _full(first)
    rows = np.concatenate(full) if full else np.zeros(0, np.int64)
    out = {
        "chunks_per_batch": cpb,
        "chunks_per_batch_uniform": uniform_chunks_per_batch(chunk_of[rows], b),
        "vif_pos": vif(first, np.arange(n) / n),
        "vif_ar": vif(first, ar1_series(n, seed=seed)),
        "recurrence": recurrence(first, epochs[1]) if len(epochs) > 1 else float("nan"),
        "pair_excess": pair_excess(first, chunk_of),
    }
    out["chunks_per_batch_ratio"] = cpb / out["chunks_per_batch_uniform"]
    return out


def uniform_batches(rows: np.ndarray, batch_size: int, *, seed: int) -> list[np.ndarray]:
    """A uniform permutation of ``rows`` cut into batches (the reference)."""
    perm = np.random.default_rng(seed).permutation(np.asarray(rows, np.int64))
    return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]


def shuffle_buffer_batches(
    chunk_sizes: Sequence[int], batch_size: int, *, buffer_rows: int, seed: int
) -> list[np.ndarray]:
    """A ``tf.data``-style stream: chunks in a shuffled order (as ``list_files(shuffle=True)``),
    their rows in storage order through a shuffle buffer of ``buffer_rows`` rows (each output
    a random buffer entry, replaced by the next input), cut into batches."""
    sizes = np.asarray(chunk_sizes, np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sizes))
    stream = np.concatenate([np.arange(starts[c], starts[c] + sizes[c]) for c in order])
    k = max(1, min(int(buffer_rows), len(stream)))
    buf = stream[:k].copy()
    out = np.empty(len(stream), np.int64)
    picks = rng.random(len(stream))
    fill = len(buf)
    nxt = k
    for i in range(len(stream)):
        j = int(picks[i] * fill)
        out[i] = buf[j]
        if nxt < len(stream):
            buf[j] = stream[nxt]
            nxt += 1
        else:
            fill -= 1
            buf[j] = buf[fill]
    return [out[i : i + batch_size] for i in range(0, len(out), batch_size)]
