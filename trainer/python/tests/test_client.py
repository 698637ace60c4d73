"""The client against a real 3-node cluster: round trips at every level,
bad input refused with clear exceptions and no change, table management."""

import time

import grpc
import numpy as np
import pytest

import raftps
from raftps import errors
from raftps.pb import client_pb2 as pb

from conftest import leader_of

DIM = 8


def counter_table(client, name, consistency=None, dim=DIM, shards=4):
    """A table where pushing -g adds g: sgd with lr 1 from zeros."""
    kw = {"consistency": consistency} if consistency else {}
    return client.create_table(name, dim, optimizer="sgd:lr=1", initializer="zeros", shards=shards, **kw)


def eventually_equal(fn, want, timeout=10.0):
    """fn() until it equals want (a replica catching up), else the last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if np.array_equal(got, want) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def round_bf16(x):
    """float32 → the nearest bfloat16 (ties to even), as float32: what the
    nodes do to a float32 push to a bf16 table."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def test_bf16_table(client, table_name, monkeypatch):
    spec = client.create_table(table_name, DIM, optimizer="sgd:lr=1", initializer="zeros", shards=4,
                               grad_precision="bf16")
    assert spec.grad_precision == "bf16"
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64))
    grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    import raftps.client as rc
    encoded = []
    real = rc.to_bf16
    monkeypatch.setattr(rc, "to_bf16", lambda x: encoded.append(x.shape) or real(x))
    client.push(table_name, keys, -grads)
    assert encoded == [grads.shape], "the push did not go as bfloat16"
    got = client.pull(table_name, keys)
    want = round_bf16(grads)
    assert not np.array_equal(want, grads)  # the rounding is visible
    np.testing.assert_array_equal(got, want)
    # The client sends such a table bfloat16 (half the bytes), rounded as
    # the nodes round a float32 push.
    bits = real(grads)
    assert bits.dtype == np.dtype("<u2") and bits.shape == grads.shape
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), want)


@pytest.mark.parametrize("table_level", ["linearizable", "bounded:100ms", "eventual"])
def test_round_trip_at_every_level(client, table_name, table_level):
    spec = counter_table(client, table_name, table_level)
    assert spec.consistency.name.lower() == table_level.split(":")[0]
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**64 - 1, size=500, dtype=np.uint64)
    keys[100:150] = keys[:50]  # repeated keys are summed
    grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    client.push(table_name, keys, -grads)
    want = np.zeros((len(keys), DIM), dtype=np.float32)
    sums = {}
    for k, g in zip(keys.tolist(), grads):
        sums[k] = sums.get(k, np.zeros(DIM, np.float32)) + g
    for i, k in enumerate(keys.tolist()):
        want[i] = sums[k]
    # Linearizable reads see the push at once, at any table level.
    got = client.pull(table_name, keys, consistency="linearizable")
    assert got.dtype == np.float32 and got.shape == (len(keys), DIM)
    np.testing.assert_array_equal(got, want)
    # The table's own level, and each weaker one asked for knowingly, see
    # it once the replica serving them has applied it.
    for level in [None, "bounded:200ms", "eventual"]:
        got = eventually_equal(lambda: client.pull(table_name, keys, consistency=level, allow_weaker=True), want)
        np.testing.assert_array_equal(got, want, err_msg=f"read at {level}")
    # Rows come back in the caller's order, repeats included.
    perm = rng.permutation(len(keys))
    np.testing.assert_array_equal(client.pull(table_name, keys[perm], consistency="linearizable"), want[perm])


def test_weaker_read_needs_allow_weaker(client, table_name):
    counter_table(client, table_name)
    with pytest.raises(raftps.WeakerConsistencyError):
        client.pull(table_name, [1, 2], consistency="eventual")


def test_bad_input_raises_and_changes_nothing(client, cluster, table_name):
    counter_table(client, table_name)
    keys = np.arange(1, 201, dtype=np.uint64)
    client.push(table_name, keys, -np.ones((200, DIM), np.float32))
    before = client.pull(table_name, keys, consistency="linearizable")

    with pytest.raises(raftps.DimMismatchError):
        client.push(table_name, keys, np.ones((200, DIM + 1), np.float32))
    with pytest.raises(raftps.DimMismatchError):
        client.push(table_name, keys, np.ones(200 * DIM - 1, np.float32))
    nan = np.ones((200, DIM), np.float32)
    nan[137, 3] = np.nan  # one bad value in a batch over every shard
    with pytest.raises(raftps.NonFiniteError):
        client.push(table_name, keys, nan)
    nan[137, 3] = np.inf
    with pytest.raises(raftps.NonFiniteError):
        client.push(table_name, keys, nan)
    with pytest.raises(raftps.UnknownTableError):
        client.push("no_such_table", keys, np.ones((200, DIM), np.float32))
    with pytest.raises(raftps.UnknownTableError):
        client.pull("no_such_table", keys)
    with pytest.raises(raftps.InvalidConfigError):
        client.create_table(table_name + "_bad", 0)

    # The nodes refuse the same on their own: a request that skips the
    # client's checks gets the reason, mapped to the same exceptions.
    shard = raftps.shard_of(keys[:1], 4)[0]
    leader = leader_of(client, table_name, int(shard))
    stub = client.stub(leader)
    req = pb.PushRequest(table=table_name, shard=int(shard), client_id=client.client_id ^ 0xFF, seq=1,
                         keys=keys[:1].tobytes(), grads=np.full(DIM, np.nan, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as ei:
        stub.Push(req, timeout=5)
    assert isinstance(errors.from_rpc_error(ei.value), raftps.NonFiniteError)
    req.seq, req.grads = 2, np.ones(DIM - 1, np.float32).tobytes()
    with pytest.raises(grpc.RpcError) as ei:
        stub.Push(req, timeout=5)
    assert isinstance(errors.from_rpc_error(ei.value), raftps.DimMismatchError)

    after = client.pull(table_name, keys, consistency="linearizable")
    np.testing.assert_array_equal(after, before)


def test_tables_create_describe_list_alter(client, cluster, table_name):
    spec = client.create_table(table_name, 16, optimizer="adagrad", shards=3)
    assert (spec.dim, spec.shards, spec.replicas) == (16, 3, 3)
    with pytest.raises(raftps.TableExistsError):
        client.create_table(table_name, 8)
    info = client.describe_table(table_name)
    assert info.spec.dim == 16 and len(info.replicas) == 3 and all(len(r) == 3 for r in info.replicas)
    assert set(info.nodes.values()) == set(cluster.addrs)
    assert table_name in [t.name for t in client.list_tables()]
    altered = client.alter_table(table_name, consistency="bounded:250ms")
    assert altered.consistency == raftps.Consistency.BOUNDED and abs(altered.staleness - 0.25) < 1e-9
    # Another client sees the new level (each node once its metadata
    # replica has applied the change).
    with cluster.client() as other:
        deadline = time.monotonic() + 10
        while other.describe_table(table_name).spec.consistency != raftps.Consistency.BOUNDED:
            assert time.monotonic() < deadline, "the alter did not reach another client in 10 s"
            time.sleep(0.1)
    with pytest.raises(raftps.UnknownTableError):
        client.describe_table(table_name + "_missing")


def test_status(client, cluster):
    st = client.status(cluster.addrs[0])
    assert st["addr"] == cluster.addrs[0]
    assert {n["addr"] for n in st["nodes"]} == set(cluster.addrs)
    assert any(r["group"] == "meta" for r in st["replicas"])

