"""Feature names of wide variables, computed on demand.

A flattened 2-D grid of 2160 x 4320 points has 9.3 M features named ``var[i,j]``: building
them as Python strings took seconds, more than reading the grid (issue 13, item 9). A
:class:`GridNames` is the sequence of those names without holding them: ``len`` and indexing
are O(1). The manifest's feature file stores a grid's rule (its name and per-dim labels,
:meth:`GridNames.to_rule` / :meth:`GridNames.from_rule`), not the names; other sequences of
names are stored as UTF-8 joined by NUL (:meth:`GridNames.utf8_joined` builds those bytes row by
row from byte templates with numpy, for grids inside a :class:`ChainedNames`).

This module is part of the read side: numpy only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

#: names in one piece of :func:`utf8_chunks` (a few hundred KB)
PIECE_NAMES = 1 << 14


class GridNames(Sequence[str]):
    """``f"{name}[{l0},{l1},...]"`` for every label combination, C order (the last dim fastest)."""

    def __init__(self, name: str, labels: Sequence[Sequence[str]]) -> None:
        self.name = name
        self.labels = [list(map(str, lab)) for lab in labels]
        self.shape = tuple(len(lab) for lab in self.labels)
        self._len = int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        return self._len

    def _one(self, i: int) -> str:
        idx = np.unravel_index(i, self.shape)
        return f"{self.name}[{','.join(lab[k] for lab, k in zip(self.labels, idx, strict=True))}]"

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self._one(k) for k in range(*i.indices(self._len)))
        return self._one(_feature_index(i, self._len))

    def __iter__(self) -> Iterator[str]:
        heads = self.labels[0]
        for lab in self.labels[1:-1]:
            heads = [f"{h},{x}" for h in heads for x in lab]
        if len(self.labels) == 1:
            return iter([f"{self.name}[{x}]" for x in heads])
        last = self.labels[-1]
        return (f"{self.name}[{h},{x}]" for h in heads for x in last)

    def utf8_joined(self) -> bytes:
        """Every name, UTF-8, joined by NUL: ``"\\0".join(self).encode()``, without the strings."""
        return b"".join(self.utf8_chunks())

    def utf8_chunks(self) -> Iterator[bytes]:
        """:meth:`utf8_joined` in pieces of at most :data:`PIECE_NAMES` names (a feature file
        of millions of names is written piece by piece, never joined whole).

        The names of one value of every leading label share their head (``name[l0,...,``):
        one byte template of the trailing labels per head length, the head written into it at
        the known offsets. Trailing dims are taken together while their names fit one piece: a
        short last dim (a flat view's ``v[time, lev]``: 4 levels) would otherwise give one
        piece of a few names per head (2,880 pieces of 4 names for 2,880 x 4).
        """
        if not self._len:
            return
        split = len(self.labels) - 1  # the labels from here on are the pieces' tails
        while split and _tails(self.labels[split - 1 :]) <= PIECE_NAMES:
            split -= 1
        last = [",".join(combo) for combo in itertools.product(*self.labels[split:])]
        pieces = [
            [f"{x}]\0".encode() for x in last[i : i + PIECE_NAMES]]
            for i in range(0, len(last), PIECE_NAMES)
        ]
        left = self._len // len(last) * len(pieces)  # pieces to yield
        templates: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for labels in itertools.product(*self.labels[:split]):
            head = (f"{self.name}[" + "".join(f"{x}," for x in labels)).encode()
            k = len(head)
            for p, tails in enumerate(pieces):
                t = templates.get((k, p)) or _template(k, tails)
                if len(pieces) == 1:  # else a 1-D grid: its one head uses each piece once
                    templates[(k, p)] = t
                buf, where = t
                buf[where] = np.tile(np.frombuffer(head, np.uint8), len(tails))
                left -= 1
                yield buf.tobytes() if left else buf[:-1].tobytes()  # no NUL after the last

    def to_rule(self) -> bytes:
        """The grid as a rule: UTF-8 JSON ``{"name": ..., "labels": [[...], ...]}`` (kilobytes
        where the names would take ~100 MB); :meth:`from_rule` gives back an equal grid."""
        return json.dumps({"name": self.name, "labels": self.labels}, ensure_ascii=False).encode()

    @classmethod
    def from_rule(cls, rule: bytes) -> GridNames:
        """The grid :meth:`to_rule` wrote; ``ValueError`` for anything else."""
        d = json.loads(rule.decode("utf-8"))
        if not (
            isinstance(d, dict)
            and isinstance(d.get("name"), str)
            and isinstance(d.get("labels"), list)
            and d["labels"]
            and all(isinstance(lab, list) for lab in d["labels"])
            and all(isinstance(x, str) for lab in d["labels"] for x in lab)
        ):
            raise ValueError("not a grid of feature names (name and lists of labels)")
        return cls(d["name"], d["labels"])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GridNames):
            return self.name == other.name and self.labels == other.labels
        if isinstance(other, Sequence):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GridNames({self.name!r}, shape={self.shape})"


class ChainedNames(Sequence[str]):
    """Several variables' names one after the other (lazy where the parts are)."""

    def __init__(self, parts: Sequence[Sequence[str]]) -> None:
        self.parts = list(parts)
        self._starts = np.cumsum([0, *(len(p) for p in self.parts)])

    def __len__(self) -> int:
        return int(self._starts[-1])

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(*i.indices(len(self))))
        k = _feature_index(i, len(self))
        p = int(np.searchsorted(self._starts, k, side="right")) - 1
        return self.parts[p][int(k - self._starts[p])]

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self.parts)

    def utf8_joined(self) -> bytes:
        return b"".join(self.utf8_chunks())

    def utf8_chunks(self) -> Iterator[bytes]:
        first = True
        for p in self.parts:
            if len(p):
                if not first:
                    yield b"\0"
                first = False
                yield from utf8_chunks(p)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def utf8_chunks(names: Sequence[str]) -> Iterator[bytes]:
    """``"\\0".join(names).encode()`` in pieces of at most :data:`PIECE_NAMES` names: lazy
    names by their own ``utf8_chunks``, others a slice at a time.

    >>> b"".join(utf8_chunks(["a", "b", "c"])), b"".join(utf8_chunks(GridNames("x", [[1, 2]])))
    (b'a\\x00b\\x00c', b'x[1]\\x00x[2]')
    """
    if isinstance(names, (GridNames, ChainedNames)):
        yield from names.utf8_chunks()
        return
    seq = names if isinstance(names, (list, tuple)) else list(names)
    for i in range(0, len(seq), PIECE_NAMES):
        yield (("\0" if i else "") + "\0".join(seq[i : i + PIECE_NAMES])).encode("utf-8")


def _tails(labels: Sequence[Sequence[str]]) -> int:
    """How many label combinations ``labels`` give (1 for none)."""
    return int(np.prod([len(lab) for lab in labels], dtype=np.int64))


def _template(k: int, tails: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of ``tails`` each after ``k`` zero bytes, and the offsets of those bytes."""
    tail_len = np.array([len(t) for t in tails], np.int64)
    starts = np.concatenate([[0], np.cumsum(k + tail_len)[:-1]])
    buf = np.frombuffer(b"".join(b"\0" * k + t for t in tails), np.uint8).copy()
    return buf, (starts[:, None] + np.arange(k)).ravel()


def _feature_index(i: int, n: int) -> int:
    """Index ``i`` (negative from the end) of a sequence of ``n`` feature names, checked."""
    k = i + n if i < 0 else i
    if not 0 <= k < n:
        raise IndexError(f"feature {i} out of range ({n} features)")
    return int(k)
