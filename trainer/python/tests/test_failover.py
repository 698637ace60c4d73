"""Pulls and pushes go on through a SIGKILL of a shard's leader, and nothing
acknowledged is lost or applied twice: a counter table, as raftps demo checks."""

import threading
import time

import grpc
import numpy as np

import raftps
from conftest import leader_of
from raftps.pb import client_pb2 as pb

COUNTERS = 64
SHARDS = 4


def test_pull_and_push_through_leader_kill(cluster, table_name):
    c = cluster.client(retry_timeout=20.0, attempt_timeout=2.0)
    c.create_table(table_name, 1, optimizer="sgd:lr=1", initializer="zeros", shards=SHARDS)
    acked = np.zeros(COUNTERS, dtype=np.int64)
    failures, stale_reads, done = [], [], threading.Event()
    pushes_after_kill = [0]
    killed_at = [None]
    keys = np.arange(COUNTERS, dtype=np.uint64)

    def loop():
        i = 0
        while not done.is_set():
            batch = keys[(np.arange(8) + i * 8) % COUNTERS]
            try:
                c.push(table_name, batch, -np.ones((8, 1), np.float32))
            except raftps.RaftpsError as e:
                failures.append(f"push: {e}")
                continue
            acked[batch.astype(np.int64)] += 1
            if killed_at[0] is not None:
                pushes_after_kill[0] += 1
            floor = acked.copy()
            try:
                got = c.pull(table_name, keys, consistency="linearizable")[:, 0]
            except raftps.RaftpsError as e:
                failures.append(f"pull: {e}")
                continue
            # A linearizable read sees at least every push acknowledged
            # before it began.
            if (got < floor).any():
                stale_reads.append((floor - got).max())
            i += 1

    t = threading.Thread(target=loop)
    t.start()
    victim = None
    try:
        time.sleep(1.5)
        # The victim is whoever leads shard 0 now.
        leader = leader_of(c, table_name, 0)
        victim = cluster.node_of(leader)
        killed_at[0] = time.monotonic()
        cluster.kill(victim)
        # Go on until a number of pushes after the kill were acknowledged
        # (seconds on an idle machine; longer on a loaded one).
        deadline = time.monotonic() + 60
        while pushes_after_kill[0] < 20 and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.2)
    finally:
        done.set()
        t.join(timeout=60)
    try:
        assert not t.is_alive(), "the loop did not end"
        assert not failures, failures[:3]
        assert not stale_reads, f"{len(stale_reads)} linearizable reads missed acknowledged pushes"
        assert pushes_after_kill[0] >= 20, f"only {pushes_after_kill[0]} pushes in 60 s after the kill"
        # Leadership of shard 0 moved off the victim.
        assert leader_of(c, table_name, 0) != leader
        got = c.pull(table_name, keys, consistency="linearizable")[:, 0]
        lost = int(np.clip(acked - got, 0, None).sum())
        doubled = int(np.clip(got - acked, 0, None).sum())
        assert (lost, doubled) == (0, 0), f"{acked.sum()} acknowledged pushes: {lost} lost, {doubled} applied twice"
    finally:
        if victim:
            cluster.restart(victim)
        c.close()
    # The restarted node catches up: its own replicas (read there alone,
    # eventual) agree with the acknowledged counts.
    addr = cluster.addrs[int(victim[1:]) - 1]
    shard_of = raftps.shard_of(keys, SHARDS)
    with cluster.client() as c2:
        stub = c2.stub(addr)
        deadline = time.monotonic() + 20
        for s in range(SHARDS):
            ks = keys[shard_of == s]
            req = pb.PullRequest(table=table_name, shard=s, keys=ks.tobytes(), consistency=pb.CONSISTENCY_EVENTUAL,
                                 allow_weaker=True)
            while True:
                try:
                    got = np.frombuffer(stub.Pull(req, timeout=2).values, np.float32)
                    if (got == acked[shard_of == s]).all():
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, f"{victim}'s replica of shard {s} did not catch up"
                time.sleep(0.2)
