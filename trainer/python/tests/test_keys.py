"""Go and Python shard keys the same way: both check the committed vectors."""

import json
import os

import numpy as np

from conftest import REPO
from raftps.keys import Split, as_keys, mix64, shard_of

VECTORS = os.path.join(REPO, "shard", "api", "testdata", "shard_vectors.json")


def test_shard_of_matches_go_vectors():
    with open(VECTORS) as f:
        v = json.load(f)
    keys = np.array([int(k["key"]) for k in v["keys"]], dtype=np.uint64)
    assert len(keys) > 200
    assert [str(int(m)) for m in mix64(keys)] == [k["mix64"] for k in v["keys"]]
    for j, n in enumerate(v["counts"]):
        want = [k["shards"][j] for k in v["keys"]]
        assert shard_of(keys, n).tolist() == want, f"{n} shards"


def test_signed_keys_are_their_bit_patterns():
    assert as_keys(np.array([-1, 5], dtype=np.int64)).tolist() == [2**64 - 1, 5]
    assert as_keys([2**64 - 1, 0]).tolist() == [2**64 - 1, 0]


def test_split_puts_rows_back_in_the_callers_order():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 50, size=400).astype(np.uint64)
    sp = Split(keys, 7)
    # Every shard's range holds only its keys, and each distinct key once.
    for s in range(7):
        lo, hi = sp.range(s)
        assert (shard_of(sp.keys[lo:hi], 7) == s).all()
    assert len(set(sp.keys.tolist())) == len(sp.keys) == len(set(keys.tolist()))
    assert (sp.keys[sp.pos] == keys).all()
    # Rows of a repeated key are summed in batch order.
    g = rng.standard_normal((400, 3)).astype(np.float32)
    sums = sp.sum_rows(g)
    for u, k in enumerate(sp.keys[:10]):
        acc = np.zeros(3, dtype=np.float32)
        for i in np.flatnonzero(keys == k):
            acc += g[i]
        assert (sums[u] == acc).all()
