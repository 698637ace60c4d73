"""The key -> shard function and the packing of keys and rows.

shard_of is part of the wire contract (shard/api/keys.go): clients and nodes
must agree on it, so it never changes. tests/test_keys.py checks it against
shard/api/testdata/shard_vectors.json, which a Go test checks against the
Go function.
"""

import numpy as np

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S = np.uint64(33)


def as_keys(keys):
    """keys as a 1-d little-endian uint64 array (a view when it already is one).

    Signed integers are taken as their two's complement bit pattern, as a
    Go uint64(int64) conversion does, so torch's int64 ids map one to one.
    """
    if not isinstance(keys, np.ndarray) and not hasattr(keys, "__array__"):
        try:
            keys = np.asarray(keys, dtype=np.int64)
        except OverflowError:  # a Python int past 2^63: take its low 64 bits
            keys = np.array([int(k) & 0xFFFFFFFFFFFFFFFF for k in keys], dtype=np.uint64)
    a = np.asarray(keys)
    if a.dtype == np.uint64:
        pass
    elif a.dtype.kind == "i":
        a = a.astype(np.int64, copy=False).view(np.uint64)
    elif a.dtype.kind == "u" or a.size == 0:
        a = a.astype(np.uint64)
    else:
        raise TypeError(f"raftps: keys must be integers, got an array of {a.dtype}")
    if a.ndim != 1:
        a = a.reshape(-1)
    return np.ascontiguousarray(a, dtype="<u8")


def mix64(keys):
    """MurmurHash3's finalizer of each key (shard/api.Mix64)."""
    h = as_keys(keys).copy()
    with np.errstate(over="ignore"):
        h ^= h >> _S
        h *= _M1
        h ^= h >> _S
        h *= _M2
        h ^= h >> _S
    return h


def shard_of(keys, n):
    """The shard of each key of a table of n shards (shard/api.ShardOf)."""
    return (mix64(keys) % np.uint64(n)).astype(np.uint32)


def group_id(table, shard):
    """A shard's replication group: "table/shard"."""
    return f"{table}/{shard}"


class Split:
    """The distinct keys of a batch, grouped by shard.

    keys holds the distinct keys with every shard's keys together (shard 0's
    first); bounds[s]:bounds[s+1] is shard s's range of them; pos[i] is the
    place of the batch's key i in keys. Rows answered per shard fill the
    same ranges of a (len(keys), dim) array, and rows[pos] is the batch's
    rows in the caller's order: no per-key Python loop anywhere.
    """

    def __init__(self, keys, shards):
        uniq, inverse = np.unique(keys, return_inverse=True)
        sh = shard_of(uniq, shards)
        order = np.argsort(sh, kind="stable")
        self.keys = uniq[order]
        self.bounds = np.searchsorted(sh[order], np.arange(shards + 1, dtype=np.uint32))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        self.pos = rank[inverse.reshape(-1)]
        self.distinct = len(uniq) == len(keys)

    def shards(self):
        """The shards with keys, in order."""
        b = self.bounds
        return [s for s in range(len(b) - 1) if b[s + 1] > b[s]]

    def range(self, s):
        return int(self.bounds[s]), int(self.bounds[s + 1])

    def sum_rows(self, grads):
        """The gradients of the distinct keys: rows of a key that occurs more
        than once summed in batch order, as the Go client sums them."""
        if self.distinct:
            out = np.empty_like(grads)
            out[self.pos] = grads
            return out
        # The r-th occurrences of every repeated key are added in round r:
        # each key's rows are summed in batch order, a vectorised step per
        # round (as many rounds as the most repeated key has rows).
        order = np.argsort(self.pos, kind="stable")
        sp = self.pos[order]
        first = np.r_[True, sp[1:] != sp[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(sp)), 0))
        occ = np.arange(len(sp)) - start
        by_round = np.argsort(occ, kind="stable")
        bounds = np.r_[0, np.cumsum(np.bincount(occ))]
        out = np.zeros((len(self.keys), grads.shape[1]), dtype=grads.dtype)
        for r in range(len(bounds) - 1):
            sel = by_round[bounds[r]:bounds[r + 1]]
            out[sp[sel]] += grads[order[sel]]
        return out
