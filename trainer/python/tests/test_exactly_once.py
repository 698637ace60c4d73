"""A push whose answer is lost (the node applied it, the client never heard)
is retried with the same (client ID, seq) and applied once."""

import threading

import grpc
import numpy as np
import pytest

import raftps
from raftps.pb import client_pb2 as pb

PUSH = "/raftps.v1.ParameterServer/Push"
PUSH_BATCH = "/raftps.v1.ParameterServer/PushBatch"


class _Lost(grpc.RpcError):
    """What a client sees when a node's answer never arrives."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "answer lost (test)"

    def trailing_metadata(self):
        return ()


class LoseAnswers(grpc.UnaryUnaryClientInterceptor):
    """Lets push calls reach their node and be answered; throws away the
    answers of the first `lose` that the node accepted (applied, or found
    to be duplicates): their outcome is unknown to the client. Records every
    push part the nodes accepted: (client_id, shard, seq, duplicate)."""

    def __init__(self, lose):
        self.lose = lose
        self.mu = threading.Lock()
        self.accepted = []

    def intercept_unary_unary(self, continuation, details, request):
        outcome = continuation(details, request)
        if details.method not in (PUSH, PUSH_BATCH):
            return outcome
        try:
            resp = outcome.result()
        except grpc.RpcError:
            return outcome  # refused as a whole (not the leader, say): not applied
        if details.method == PUSH_BATCH:
            parts = [(q, r) for q, r, e in zip(request.parts, resp.parts, resp.errors) if e.code == 0]
        else:
            parts = [(request, resp)]
        with self.mu:
            self.accepted += [(q.client_id, q.shard, q.seq, r.duplicate) for q, r in parts]
            lose = bool(parts) and self.lose > 0
            self.lose -= lose
        if lose:
            raise _Lost()
        return outcome


@pytest.mark.parametrize("lost", [1, 2])
def test_push_retried_after_unknown_outcome_is_applied_once(cluster, table_name, lost):
    icpt = LoseAnswers(lost)
    with cluster.client(interceptors=[icpt], retry_timeout=30) as c:
        c.create_table(table_name, 1, optimizer="sgd:lr=1", initializer="zeros", shards=1)
        c.push(table_name, [42], [[-1.0]])  # must count once
        got = c.pull(table_name, [42], consistency="linearizable")
    assert got[0, 0] == 1.0, f"the push was applied {got[0, 0]:g} times"
    # The client did retry, with the same (client, seq) every time, and the
    # nodes took each retry for the duplicate it was.
    acc = icpt.accepted
    assert len(acc) == lost + 1, acc
    assert len({a[:3] for a in acc}) == 1, acc
    assert [a[3] for a in acc] == [False] + [True] * lost, acc


def test_reused_client_id_is_detected(cluster, table_name):
    with cluster.client() as a:
        a.create_table(table_name, 1, optimizer="sgd:lr=1", initializer="zeros", shards=1)
        a.push(table_name, [1], [[-1.0]])
        # A long attempt timeout: a push whose call timed out may have been
        # applied, and its retry's duplicate answer proves nothing.
        with cluster.client(client_id=a.client_id, attempt_timeout=30) as b:
            with pytest.raises(raftps.ClientIDReusedError):
                b.push(table_name, [1], [[-1.0]])
        assert a.pull(table_name, [1])[0, 0] == 1.0
