"""The client's types: consistency levels and table specs."""

import dataclasses
import enum
import re

from raftps.pb import client_pb2 as pb


class Consistency(enum.IntEnum):
    """A table's or a read's consistency level (the wire's enum values)."""

    DEFAULT = 0
    LINEARIZABLE = 1
    BOUNDED = 2
    EVENTUAL = 3


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(s):
    """Seconds of a Go-style duration ("100ms", "1.5s", "1m30s")."""
    if isinstance(s, (int, float)):
        return float(s)
    if re.fullmatch(r"[0-9]*\.?[0-9]+", s.strip()):
        return float(s)
    total, rest = 0.0, s.strip()
    if not rest:
        raise ValueError("raftps: empty duration")
    while rest:
        m = re.match(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)", rest)
        if not m:
            raise ValueError(f"raftps: duration {s!r}: want e.g. 100ms, 2s, 1m30s")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        rest = rest[m.end():]
    return total


def parse_consistency(c):
    """(level, bound in seconds or None) of a level given as a Consistency, a
    name ("linearizable", "bounded", "eventual") or "bounded:DURATION"."""
    if c is None:
        return Consistency.DEFAULT, None
    if isinstance(c, Consistency):
        return c, None
    if isinstance(c, int):
        return Consistency(c), None
    name, _, bound = str(c).partition(":")
    try:
        level = Consistency[name.upper()]
    except KeyError:
        raise ValueError(f"raftps: consistency {c!r}: want linearizable, bounded[:DURATION] or eventual") from None
    if bound and level != Consistency.BOUNDED:
        raise ValueError(f"raftps: consistency {c!r}: only bounded takes a duration")
    return level, (parse_duration(bound) if bound else None)


@dataclasses.dataclass
class TableSpec:
    """A table's configuration (TableSpec in shard/shardpb/client.proto).

    Zero values are the nodes' defaults. staleness is the bound of a bounded
    table in seconds.
    """

    name: str
    dim: int
    initializer: str = ""
    optimizer: str = ""
    seed: int = 0
    shards: int = 0
    consistency: Consistency = Consistency.DEFAULT
    staleness: float = 0.0
    replicas: int = 0
    replication: str = ""
    hot_threshold: float = 0.0
    hot_replicas: int = 0
    # "fp32" (the default) or "bf16": pushes to a bf16 table go as bfloat16,
    # half the bytes, rounded once by the client (rows stay float32).
    grad_precision: str = ""

    def to_pb(self):
        return pb.TableSpec(
            name=self.name, dim=self.dim, initializer=self.initializer, optimizer=self.optimizer,
            seed=self.seed, shards=self.shards, consistency=int(self.consistency),
            staleness_bound_ns=int(round(self.staleness * 1e9)), replicas=self.replicas,
            replication=self.replication, hot_threshold=self.hot_threshold, hot_replicas=self.hot_replicas,
            grad_precision=self.grad_precision)

    @classmethod
    def from_pb(cls, s):
        return cls(name=s.name, dim=s.dim, initializer=s.initializer, optimizer=s.optimizer, seed=s.seed,
                   shards=s.shards, consistency=Consistency(s.consistency), staleness=s.staleness_bound_ns / 1e9,
                   replicas=s.replicas, replication=s.replication, hot_threshold=s.hot_threshold,
                   hot_replicas=s.hot_replicas, grad_precision=s.grad_precision)


@dataclasses.dataclass
class TableInfo:
    """A table's spec, and each shard's leader address, replica node IDs and
    map epoch as the answering node knows them; nodes maps node IDs to their
    client addresses."""

    spec: TableSpec
    leaders: dict
    replicas: list
    epochs: list
    nodes: dict
