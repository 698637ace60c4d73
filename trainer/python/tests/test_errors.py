"""Every reason a node may answer with maps to an exception, and the
exceptions are built from the reason in the status details."""

import os
import re

import grpc

from conftest import REPO
from raftps import errors
from raftps.pb import client_pb2 as pb


def test_every_go_reason_is_mapped():
    with open(os.path.join(REPO, "shard", "api", "errors.go")) as f:
        go = set(re.findall(r'Reason\w+\s+Reason = "(\w+)"', f.read()))
    assert len(go) > 20
    assert go == set(errors.REASONS), f"missing in Python: {go - set(errors.REASONS)}, unknown to Go: {set(errors.REASONS) - go}"
    assert errors.RETRYABLE <= go


def test_part_error_maps_by_reason_not_message():
    pe = pb.PartError(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="whatever",
                      info=pb.ErrorInfo(reason="NON_FINITE"))
    e = errors.from_part_error(pe)
    assert isinstance(e, errors.NonFiniteError) and e.reason == "NON_FINITE"
    pe = pb.PartError(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="x",
                      info=pb.ErrorInfo(reason="NOT_LEADER", leader_addr="127.0.0.1:1"))
    e = errors.from_part_error(pe)
    assert errors.retryable(e) and e.leader_addr == "127.0.0.1:1"
    e = errors.from_status(grpc.StatusCode.PERMISSION_DENIED, "no role")
    assert isinstance(e, errors.PermissionDeniedError) and not errors.retryable(e)


def test_create_retry_recognises_its_table():
    # After an attempt with an unknown outcome, create_table takes a table
    # of the same settings as its own; the nodes store defaults spelt out.
    from raftps.client import _same_table
    want = pb.TableSpec(name="t", dim=8, optimizer="adagrad", shards=3)
    have = pb.TableSpec(name="t", dim=8, optimizer="adagrad:lr=0.01,init_acc=0.1,eps=1e-07", shards=3,
                        initializer="zeros", replicas=3)
    assert _same_table(want, have)
    for other in [pb.TableSpec(name="t", dim=4), pb.TableSpec(name="t", dim=8, optimizer="adagrad:lr=0.1"),
                  pb.TableSpec(name="t", dim=8, optimizer="sgd")]:
        assert not _same_table(other, have), other
