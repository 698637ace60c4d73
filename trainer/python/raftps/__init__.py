"""raftps: the Python client of a raftps cluster, and PyTorch modules whose
embedding weights live in it (raftps.torch, imported on demand so the client
needs no torch).

    import raftps
    c = raftps.Client("127.0.0.1:7001,127.0.0.1:7002", ca="certs/ca.crt",
                      cert="certs/client.admin.crt", key="certs/client.admin.key")
    # or token="rpst_..." instead of cert and key; every credential defaults
    # to the CLI's variable (RAFTPS_CA, RAFTPS_CERT, RAFTPS_KEY,
    # RAFTPS_TOKEN), and insecure=True talks to a cluster run --insecure.
    c.create_table("users", dim=64, optimizer="adagrad")
    rows = c.pull("users", keys)             # float32 (len(keys), 64)
    c.push("users", keys, grads)             # applied exactly once
"""

from raftps.client import Client
from raftps.errors import (AlreadyExistsError, BadRequestError, ClientClosedError, ClientIDReusedError,
                           DimMismatchError, InvalidArgumentError, InvalidConfigError, NonFiniteError,
                           NotFoundError, PermissionDeniedError, RaftpsError, ResourceExhaustedError,
                           TableExistsError, UnauthenticatedError, UnavailableError, UnknownTableError,
                           WeakerConsistencyError)
from raftps.keys import shard_of
from raftps.types import Consistency, TableInfo, TableSpec

__all__ = [
    "Client", "Consistency", "TableInfo", "TableSpec", "shard_of",
    "RaftpsError", "InvalidArgumentError", "BadRequestError", "DimMismatchError", "NonFiniteError",
    "InvalidConfigError", "WeakerConsistencyError", "NotFoundError", "UnknownTableError",
    "AlreadyExistsError", "TableExistsError", "ResourceExhaustedError", "PermissionDeniedError",
    "UnauthenticatedError",
    "UnavailableError", "ClientIDReusedError", "ClientClosedError",
]
