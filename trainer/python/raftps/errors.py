"""The exceptions the raftps client raises, mapped from the nodes' error reasons.

Every error status a node answers with carries an ErrorInfo detail whose
reason is a stable word (shard/api/errors.go lists them with their gRPC
codes). The client decides by the reason, never by the message, exactly as
the Go client does: REASONS below is the Python side of that table, and a
test (tests/test_errors.py) keeps it in step with the Go file.
"""

import grpc

from raftps.pb import client_pb2 as pb


class RaftpsError(Exception):
    """An error of the raftps client or an answer of a node.

    reason: the node's reason word ("" for errors the client found itself or
    a status without one); code: the gRPC status code, if any.
    """

    def __init__(self, message, reason="", code=None, leader_addr=""):
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.leader_addr = leader_addr


class InvalidArgumentError(RaftpsError, ValueError):
    """The request is wrong; asking again will not help."""


class BadRequestError(InvalidArgumentError):
    pass


class DimMismatchError(InvalidArgumentError):
    """Keys and values disagree with the table's dimension."""


class NonFiniteError(InvalidArgumentError):
    """A NaN or Inf gradient, or an update that would overflow."""


class InvalidConfigError(InvalidArgumentError):
    pass


class WeakerConsistencyError(InvalidArgumentError):
    """A read asked for less than the table promises without allow_weaker."""


class NotFoundError(RaftpsError, LookupError):
    pass


class UnknownTableError(NotFoundError):
    pass


class AlreadyExistsError(RaftpsError):
    pass


class TableExistsError(AlreadyExistsError):
    pass


class ResourceExhaustedError(RaftpsError):
    """A request over a size limit, or a full table."""


class PermissionDeniedError(RaftpsError, PermissionError):
    """The caller's certificate or token lacks the role for the call."""


class UnauthenticatedError(PermissionDeniedError):
    """The node accepted no credential of the caller: none, a certificate of
    another CA, an unknown or revoked token."""


class UnavailableError(RaftpsError):
    """No node served the call before the retry timeout: the last error says why.

    For a push the outcome may be unknown: it may or may not have been
    applied (it was applied at most once).
    """


class ClientIDReusedError(RaftpsError):
    """A node answered that a push this client never sent was applied before:
    another client uses the same client ID (see Client's client_id)."""


class ClientClosedError(RaftpsError):
    pass


# Reasons that go away by asking again, later or elsewhere (api.Retryable).
RETRYABLE = frozenset({
    "NOT_LEADER", "UNAVAILABLE", "LEADER_NOT_READY", "UNKNOWN_OUTCOME", "GROUP_CLOSED",
    "TOO_STALE", "NOT_HOT", "NOT_TAIL", "CHAIN_STALE_EPOCH", "CHAIN_EPOCH_AHEAD",
    "CHAIN_NOT_READY", "REPLICA_BROKEN", "UNKNOWN_GROUP",
    # Stale: the client's map is out of date; it refreshes it and retries.
    "STALE_MAP", "NOT_REPLICA", "NOT_MEMBER",
})
STALE = frozenset({"STALE_MAP", "NOT_REPLICA", "NOT_MEMBER"})

# Every reason of shard/api/errors.go and the exception it raises.
REASONS = {
    "NOT_LEADER": UnavailableError,
    "LEADER_NOT_READY": UnavailableError,
    "UNKNOWN_OUTCOME": UnavailableError,
    "GROUP_CLOSED": UnavailableError,
    "SEQUENCE_TOO_OLD": BadRequestError,
    "BAD_REQUEST": BadRequestError,
    "TOO_STALE": UnavailableError,
    "NOT_HOT": UnavailableError,
    "NOT_MEMBER": UnavailableError,
    "NOT_TAIL": UnavailableError,
    "CHAIN_STALE_EPOCH": UnavailableError,
    "CHAIN_EPOCH_AHEAD": UnavailableError,
    "CHAIN_NOT_READY": UnavailableError,
    "REPLICA_BROKEN": UnavailableError,
    "UNKNOWN_GROUP": UnavailableError,
    "UNKNOWN_TABLE": UnknownTableError,
    "TABLE_EXISTS": TableExistsError,
    "INVALID_CONFIG": InvalidConfigError,
    "DIM_MISMATCH": DimMismatchError,
    "NON_FINITE": NonFiniteError,
    "TABLE_FULL": ResourceExhaustedError,
    "UNKNOWN_SHARD": NotFoundError,
    "REQUEST_TOO_LARGE": ResourceExhaustedError,
    "WEAKER_CONSISTENCY": WeakerConsistencyError,
    "UNAVAILABLE": UnavailableError,
    "UNKNOWN_JOB": NotFoundError,
    "RANK_TAKEN": AlreadyExistsError,
    "WORLD_MISMATCH": InvalidArgumentError,
    "UNKNOWN_NODE": NotFoundError,
    "EPOCH_CHANGED": UnavailableError,
    "NODE_CONFLICT": RaftpsError,
    "STALE_MAP": UnavailableError,
    "NOT_REPLICA": UnavailableError,
    # A push's log entry that no replica could apply (a bug); nothing of it
    # was applied, and sending it again would fail alike.
    "BAD_ENTRY": RaftpsError,
    "QUOTA_EXCEEDED": ResourceExhaustedError,
    "TABLE_IN_USE": RaftpsError,
    "CLUSTER_MISMATCH": RaftpsError,
    "DISK_FULL": ResourceExhaustedError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNKNOWN_TOKEN": NotFoundError,
    "TOKEN_EXISTS": AlreadyExistsError,
}

# A status without a reason (the transport's own, or a gate's refusal) is
# classed by its code.
_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}

_INFO_TYPE = "type.googleapis.com/raftps.v1.ErrorInfo"
_DETAILS_KEY = "grpc-status-details-bin"


def error_info(rpc_error):
    """The ErrorInfo detail of a gRPC error, or None."""
    md = rpc_error.trailing_metadata() if hasattr(rpc_error, "trailing_metadata") else None
    for key, value in md or ():
        if key == _DETAILS_KEY:
            return info_from_status_bytes(value)
    return None


def info_from_status_bytes(raw):
    """The ErrorInfo of a serialized google.rpc.Status (its details, field 3).

    google.rpc.Status is decoded by hand: python3-grpcio-status is not in
    every Debian release, and the three fields are simple.
    """
    from google.protobuf import any_pb2
    from google.protobuf.internal.decoder import _DecodeVarint
    i = 0
    while i < len(raw):
        tag, i = _DecodeVarint(raw, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, i = _DecodeVarint(raw, i)
            continue
        if wire != 2:
            return None
        n, i = _DecodeVarint(raw, i)
        chunk = raw[i:i + n]
        i += n
        if field == 3:
            a = any_pb2.Any()
            a.ParseFromString(chunk)
            if a.type_url == _INFO_TYPE:
                info = pb.ErrorInfo()
                a.Unpack(info)
                return info
    return None


def from_status(code, message, info=None):
    """The exception of a status: by its reason if it has one, else its code."""
    reason = info.reason if info is not None else ""
    cls = REASONS.get(reason) or _BY_CODE.get(code, RaftpsError)
    leader = info.leader_addr if info is not None else ""
    name = code.name if code is not None else "?"
    text = f"{message} ({reason or name})" if message else (reason or name)
    return cls(text, reason=reason, code=code, leader_addr=leader)


def from_rpc_error(e):
    """The exception of a grpc.RpcError (or e itself if it is not one)."""
    if not isinstance(e, grpc.RpcError) or not hasattr(e, "code"):
        return e
    return from_status(e.code(), e.details() or "", error_info(e))


def from_part_error(pe):
    """The exception of a failed batch part (a PartError)."""
    code = _code_of(pe.code)
    return from_status(code, pe.message, pe.info if pe.HasField("info") else None)


def _code_of(n):
    for c in grpc.StatusCode:
        if c.value[0] == n:
            return c
    return grpc.StatusCode.UNKNOWN


def retryable(err):
    """Whether asking again, later or elsewhere, may succeed."""
    if not isinstance(err, RaftpsError):
        return False
    if err.reason:
        return err.reason in RETRYABLE
    return err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED)


def stale(err):
    return isinstance(err, RaftpsError) and err.reason in STALE
