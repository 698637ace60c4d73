"""The raftps client: pull and push embedding rows, manage tables.

It follows the Go client (shard/client) rule for rule, so a Python trainer
gets what a Go one gets:

- every key goes to its shard by shard_of (keys.py); a batch is split by
  shard and sent as one PullBatch/PushBatch call per node that serves some
  of its shards, all calls at once; the rows come back in the caller's order;
- linearizable pulls and all pushes go to each shard's leader; bounded and
  eventual pulls (and every pull of a chain table) are spread over the
  shard's replicas;
- a part that a batch call did not complete (not the leader, a node that
  did not answer, a map that moved) goes to the per-shard path, which
  follows NOT_LEADER redirects, refreshes the shard map on STALE_MAP and
  retries with backoff until retry_timeout;
- every push carries (client ID, sequence number): its request is built once
  and every retry sends the same pair, so it is applied at most once.

What it does not do (yet) that the Go client does: hedged reads, reads of
hot keys from their read replicas, and asking other nodes whether a node
that does not answer is dead (PeerContact); a call to a frozen node here
costs attempt_timeout before it is retried elsewhere.

Concurrency: a Client may be shared by threads. Its caches (specs, maps,
leaders, sequence numbers, silent nodes, channels) are guarded by one lock,
never held across a call. Batch calls run as gRPC futures; the per-shard
retries of one call run on the client's thread pool.
"""

import concurrent.futures
import os
import random
import secrets
import threading
import time

import grpc
import numpy as np
from google.protobuf import json_format

from raftps import errors
from raftps.errors import RaftpsError
from raftps.keys import Split, as_keys, group_id
from raftps.pb import client_pb2 as pb
from raftps.pb import client_pb2_grpc as pbg
from raftps.types import Consistency, TableInfo, TableSpec, parse_consistency

# How long a node that did not answer is asked after the others.
SILENT_FOR = 2.0
# How long after a node was marked silent a node that answers naming it as
# a leader counts as news that it is up (the Go client's leaderNewsAfter):
# longer than its peers take to elect another if it died or froze.
LEADER_NEWS_AFTER = 0.5
# How long a table's spec and map are used before they are asked for again
# (so an alter by another client reaches this one).
SPEC_TTL = 5.0
# The pause between retry rounds grows from 5 ms to this: an election takes
# a few hundred milliseconds, and a longer pause would add to every failover.
MAX_BACKOFF = 0.05
META_GROUP = "meta"


def channel_credentials(ca=None, cert=None, key=None, token=None, insecure=None):
    """The channel credentials of the CLI's rules, None for plaintext.

    Unset arguments default to RAFTPS_CA, RAFTPS_CERT, RAFTPS_KEY,
    RAFTPS_TOKEN and RAFTPS_INSECURE (=1), like the CLI's flags. The nodes
    serve TLS 1.3 with certificates of the cluster's CA that name their
    hosts (IP addresses and names): gRPC checks the address dialed against
    them, as the Go client does. A token travels as "authorization: Bearer
    TOKEN" on every call, over TLS only.
    """
    env = os.environ.get
    ca = ca if ca is not None else env("RAFTPS_CA", "")
    cert = cert if cert is not None else env("RAFTPS_CERT", "")
    key = key if key is not None else env("RAFTPS_KEY", "")
    token = token if token is not None else env("RAFTPS_TOKEN", "")
    if insecure is None:
        insecure = env("RAFTPS_INSECURE", "") == "1"
    if insecure:
        if ca or cert or token:
            raise ValueError("raftps: insecure with credentials (ca, cert, token or their RAFTPS_ variables): give one or the other")
        return None
    if not ca:
        raise ValueError("raftps: no CA: pass ca= (or set RAFTPS_CA; '. DIR/env' sets it for a local cluster), "
                         "or insecure=True for a cluster run with --insecure")
    if bool(cert) != bool(key):
        raise ValueError("raftps: cert and key go together")
    if not cert and not token:
        raise ValueError("raftps: no credential: pass cert= and key=, or token= (or set RAFTPS_CERT and RAFTPS_KEY, or RAFTPS_TOKEN)")
    if cert and token:
        raise ValueError("raftps: both a client certificate and a token: give one")

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    if cert:
        creds = grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key), certificate_chain=read(cert))
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=read(ca))
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


class Client:
    """A client of a raftps cluster.

    addrs: node client addresses (a list or "host:port,host:port"); the
    client learns the rest of the cluster from them. Default: the
    RAFTPS_CLUSTER environment variable, as the CLI's.

    client_id: identifies this client's pushes for deduplication; 0 draws a
    random one. Never give two Client instances (or a restarted process) the
    same ID: every Client numbers its pushes from 1 again, and the nodes
    would drop the new pushes as retries of the old ones.

    retry_timeout bounds one call's retries (seconds); attempt_timeout one
    call to one node within them. interceptors are gRPC client interceptors
    put on every channel (tracing, metadata, fault injection in tests).

    Credentials, as the CLI's flags and with the same environment variables
    for their defaults: ca (RAFTPS_CA), the cluster's CA certificate file,
    to check the nodes against; and either a client certificate, cert and
    key (RAFTPS_CERT, RAFTPS_KEY), or a bearer token, token (RAFTPS_TOKEN,
    made by 'raftps token create'). '. DIR/env' of 'raftps cluster up' sets
    them. insecure=True (or RAFTPS_INSECURE=1) talks plaintext to a cluster
    run with --insecure, and only then: without credentials the client
    refuses to start rather than fall back to plaintext.
    """

    def __init__(self, addrs=None, *, client_id=0, retry_timeout=30.0, attempt_timeout=10.0,
                 max_message_bytes=64 << 20, interceptors=(), max_workers=32,
                 ca=None, cert=None, key=None, token=None, insecure=None):
        if addrs is None:
            addrs = os.environ.get("RAFTPS_CLUSTER", "")
        if isinstance(addrs, str):
            addrs = addrs.split(",")
        self.addrs = [a.strip() for a in addrs if a.strip()]
        if not self.addrs:
            raise ValueError("raftps: no cluster given: pass addrs or set RAFTPS_CLUSTER")
        if retry_timeout <= 0 or attempt_timeout <= 0:
            raise ValueError(f"raftps: retry_timeout ({retry_timeout}) and attempt_timeout ({attempt_timeout}) must be positive")
        self._creds = channel_credentials(ca=ca, cert=cert, key=key, token=token, insecure=insecure)
        self.client_id = client_id or (secrets.randbits(64) | 1)
        self.retry_timeout = float(retry_timeout)
        self.attempt_timeout = float(attempt_timeout)
        # Redial a node that is down within a second (the Go client's
        # redial): grpc's default backoff grows to 2 minutes, and a node
        # back from a restart may lead shards at once.
        self._options = [("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.initial_reconnect_backoff_ms", 100),
                         ("grpc.min_reconnect_backoff_ms", 100),
                         ("grpc.max_reconnect_backoff_ms", 1000)]
        self._interceptors = list(interceptors)
        self._mu = threading.Lock()
        self._stubs = {}  # addr -> (channel, stub)
        self._specs = {}  # table -> (pb.TableSpec, learnt at)
        self._maps = {}  # table -> _TableMap
        self._leaders = {}  # group -> addr
        self._seqs = {}  # group -> last seq
        self._silent = {}  # addr -> until (monotonic)
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="raftps")

    # --- life cycle -----------------------------------------------------

    def close(self):
        """Close the channels; calls after close raise ClientClosedError."""
        with self._mu:
            self._closed = True
            stubs, self._stubs = self._stubs, {}
        for ch, _ in stubs.values():
            ch.close()
        self._pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stub(self, addr):
        """The generated gRPC stub of the node at addr, over the client's
        channel: the escape hatch to calls this class does not wrap. Its
        errors are grpc.RpcError; errors.from_rpc_error converts them."""
        with self._mu:
            if self._closed:
                raise errors.ClientClosedError("raftps: client closed")
            s = self._stubs.get(addr)
            if s is None:
                if self._creds is None:
                    ch = grpc.insecure_channel(addr, options=self._options)
                else:
                    ch = grpc.secure_channel(addr, self._creds, options=self._options)
                if self._interceptors:
                    ch = grpc.intercept_channel(ch, *self._interceptors)
                s = (ch, pbg.ParameterServerStub(ch))
                self._stubs[addr] = s
            return s[1]

    # --- data -----------------------------------------------------------

    def pull(self, table, keys, consistency=None, staleness=None, allow_weaker=False):
        """The rows of keys: a float32 array of shape (len(keys), dim).

        consistency: None (the table's level), a Consistency, or
        "linearizable", "bounded", "bounded:100ms", "eventual". A stronger
        level than the table's is always allowed; a weaker one only with
        allow_weaker. staleness (seconds) makes it a bounded read at that
        bound. Keys never pushed come back as the table's initial values.
        """
        level, bound = parse_consistency(consistency)
        if staleness is not None:
            bound = float(staleness)
            if level == Consistency.DEFAULT:
                level = Consistency.BOUNDED
        if bound is not None and bound <= 0:
            raise errors.BadRequestError(f"raftps: pull from table {table!r}: staleness {bound} must be positive")
        keys = as_keys(keys)
        spec = self._spec(table)
        dim = spec.dim
        if len(keys) == 0:
            return np.zeros((0, dim), dtype=np.float32)
        effective = Consistency(level or spec.consistency or Consistency.LINEARIZABLE)
        spread = effective != Consistency.LINEARIZABLE or spec.replication == "chain"
        sp = Split(keys, spec.shards)
        rows = np.empty((len(sp.keys), dim), dtype=np.float32)
        base = dict(table=table, consistency=int(level), staleness_bound_ns=int(round((bound or 0) * 1e9)),
                    allow_weaker=allow_weaker)
        op = _PullOp(self, table, sp, rows, base, spread)
        self._fan_out(table, op, spread)
        return rows[sp.pos]

    def push(self, table, keys, grads):
        """Send gradients (len(keys) x dim, row i for keys[i]) for the nodes'
        optimizer to apply. Rows of a key that occurs more than once are
        summed first. Every shard's part is applied exactly once however
        often it is retried; push returns once all are applied. Bad input
        (wrong shape, NaN or Inf) raises before anything is sent."""
        keys = as_keys(keys)
        spec = self._spec(table)
        dim = spec.dim
        g = np.asarray(grads, dtype=np.float32)
        if g.size != len(keys) * dim or (g.ndim == 2 and g.shape[1] != dim) or g.ndim > 2:
            raise errors.DimMismatchError(
                f"raftps: push of {len(keys)} keys to table {table!r} (dim {dim}) with gradients of shape {g.shape}",
                reason="DIM_MISMATCH")
        if len(keys) == 0:
            return
        g = g.reshape(len(keys), dim)
        if not np.isfinite(g).all():
            raise errors.NonFiniteError(f"raftps: push to table {table!r}: the gradients hold NaN or Inf", reason="NON_FINITE")
        sp = Split(keys, spec.shards)
        sums = np.ascontiguousarray(sp.sum_rows(g), dtype="<f4")
        bf16 = spec.grad_precision == "bf16"
        op = _PushOp(self, table, sp, to_bf16(sums) if bf16 else sums, bf16)
        self._fan_out(table, op, False)

    def _fan_out(self, table, op, spread):
        """One batch call per node that some part goes to, all at once; the
        parts no call completed go to the per-shard path, concurrently."""
        by_node, retry, final = {}, [], []
        for s in op.sp.shards():
            addr = self._spread_addr(table, s) if spread else self._leader_of(table, s)
            if addr:
                by_node.setdefault(addr, []).append(s)
            else:
                retry.append((s, ""))
        calls = []
        for addr, shards in by_node.items():
            try:
                fut = op.batch_future(addr, self.stub(addr), shards, self.attempt_timeout)
            except grpc.RpcError as e:
                self._failed_call(addr, e)
                retry.extend((s, "") for s in shards)
                continue
            calls.append((addr, shards, fut))
        for addr, shards, fut in calls:
            try:
                resp = fut.result()
            except grpc.RpcError as e:
                self._failed_call(addr, e)
                op.failed(shards)
                retry.extend((s, "") for s in shards)
                continue
            for s, err in op.answered(addr, shards, resp):
                if isinstance(err, errors.ClientIDReusedError):
                    final.append(err)
                elif err is not None:
                    # Every other failure takes the per-shard path, which
                    # gives up at once on one that is not retryable.
                    if err.leader_addr:
                        self._leader_named(err.leader_addr)
                    retry.append((s, err.leader_addr or ("" if spread else addr)))
        futs = [self._pool.submit(self._shard_retry, table, s, hint, op.single) for s, hint in retry]
        final += [e for e in (f.exception() for f in futs) if e is not None]
        if final:
            raise final[0]

    # --- tables and status ----------------------------------------------

    def create_table(self, name, dim, **kw):
        """Create a table (keyword arguments: the fields of TableSpec) and
        return its spec with the defaults filled in. consistency may be
        given as in pull ("bounded:100ms" sets the staleness bound too).

        An attempt whose outcome was unknown is retried; a retry that finds
        the table there with the asked-for settings takes it as its own."""
        if "consistency" in kw:
            level, bound = parse_consistency(kw["consistency"])
            kw["consistency"] = level
            if bound is not None:
                kw["staleness"] = bound
        spec = TableSpec(name=name, dim=dim, **kw)
        req = pb.CreateTableRequest(spec=spec.to_pb())
        state = {"maybe": False, "out": None}

        def fn(addr, timeout):
            try:
                state["out"] = self.stub(addr).CreateTable(req, timeout=timeout).spec
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
                if state["maybe"] and err.reason == "TABLE_EXISTS":
                    have = self.stub(addr).DescribeTable(pb.DescribeTableRequest(name=name), timeout=timeout).spec
                    if _same_table(req.spec, have):
                        state["out"] = have
                        return
                if err.reason != "NOT_LEADER":
                    state["maybe"] = True
                raise err from None

        self._retry(META_GROUP, self._leader(META_GROUP), None, None, fn)
        self._set_spec(state["out"])
        return TableSpec.from_pb(state["out"])

    def describe_table(self, name):
        """A table's spec, placement and leaders; refreshes the caches."""
        d = self._describe(name)
        nodes = {n.id: n.addr for n in d.nodes}
        return TableInfo(spec=TableSpec.from_pb(d.spec),
                         leaders={l.shard: l.leader_addr for l in d.leaders if l.leader_addr},
                         replicas=[list(m.replicas) for m in d.shards], epochs=[m.epoch for m in d.shards],
                         nodes=nodes)

    def list_tables(self):
        out = {}

        def fn(addr, timeout):
            out["r"] = self.stub(addr).ListTables(pb.ListTablesRequest(), timeout=timeout)

        self._retry("", "", None, None, fn)
        return [TableSpec.from_pb(s) for s in out["r"].tables]

    def alter_table(self, name, consistency=None, staleness=None, hot_threshold=None, hot_replicas=None):
        """Change a table's consistency level (and bound) or hot-key settings."""
        level, bound = parse_consistency(consistency)
        if staleness is not None:
            bound = float(staleness)
        req = pb.AlterTableRequest(name=name, consistency=int(level), staleness_bound_ns=int(round((bound or 0) * 1e9)))
        if hot_threshold is not None or hot_replicas is not None:
            req.set_hot = True
            req.hot_threshold = hot_threshold or 0.0
            req.hot_replicas = hot_replicas or 0
        out = {}

        def fn(addr, timeout):
            out["r"] = self.stub(addr).AlterTable(req, timeout=timeout)

        self._retry(META_GROUP, self._leader(META_GROUP), None, None, fn)
        self._set_spec(out["r"].spec)
        return TableSpec.from_pb(out["r"].spec)

    def status(self, addr=None, checksums=False):
        """The Status answer of the node at addr (else of any node) as a dict
        (protobuf JSON field names)."""
        out = {}

        def fn(a, timeout):
            out["r"] = self.stub(a).Status(pb.StatusRequest(checksums=checksums), timeout=timeout)

        if addr:
            self._attempt(addr, fn, time.monotonic() + self.retry_timeout)
        else:
            self._retry("", "", None, None, fn)
        return json_format.MessageToDict(out["r"], preserving_proto_field_name=True)

    # --- routing ----------------------------------------------------------

    def _spec(self, table):
        with self._mu:
            s = self._specs.get(table)
        if s is not None and time.monotonic() - s[1] < SPEC_TTL:
            return s[0]
        try:
            return self._describe(table).spec
        except errors.UnknownTableError:
            raise
        except RaftpsError:
            if s is None:
                raise
            return s[0]  # keep using what we had while the cluster is busy

    def _describe(self, name, addr=None):
        out = {}

        def fn(a, timeout):
            out["r"] = self.stub(a).DescribeTable(pb.DescribeTableRequest(name=name), timeout=timeout)

        if addr:
            self._attempt(addr, fn, time.monotonic() + self.attempt_timeout)
        else:
            self._retry("", "", None, None, fn)
        self._learn(name, out["r"])
        return out["r"]

    def _learn(self, name, d):
        """Cache a DescribeTable answer: the spec, each shard's entry unless
        the client has a newer epoch of it, and their leaders."""
        with self._mu:
            self._specs[name] = (d.spec, time.monotonic())
            tm = self._maps.get(name)
            if tm is None or len(tm.shards) != len(d.shards):
                tm = _TableMap(len(d.shards))
                self._maps[name] = tm
            for n in d.nodes:
                tm.addr[n.id] = n.addr
            for i, sm in enumerate(d.shards):
                old = tm.shards[i]
                if old is not None and old.epoch > sm.epoch:
                    continue
                if old is not None and old.epoch != sm.epoch:
                    self._leaders.pop(group_id(name, i), None)
                tm.shards[i] = sm
            for l in d.leaders:
                if l.leader_addr and l.shard < len(tm.shards) and tm.shards[l.shard].epoch <= d.shards[l.shard].epoch:
                    self._leaders[group_id(name, l.shard)] = l.leader_addr

    def _set_spec(self, spec):
        with self._mu:
            self._specs[spec.name] = (spec, time.monotonic())

    def _replica_addrs(self, table, shard):
        with self._mu:
            tm = self._maps.get(table)
            if tm is None or shard >= len(tm.shards) or tm.shards[shard] is None:
                return []
            return [tm.addr[i] for i in tm.shards[shard].replicas if tm.addr.get(i)]

    def _epoch(self, table, shard):
        with self._mu:
            tm = self._maps.get(table)
            if tm is None or shard >= len(tm.shards) or tm.shards[shard] is None:
                return 0
            return tm.shards[shard].epoch

    def _leader(self, group):
        with self._mu:
            return self._leaders.get(group, "")

    def _set_leader(self, group, addr):
        with self._mu:
            self._leaders[group] = addr

    def _leader_of(self, table, shard):
        """Where a write (or linearizable read) of the shard goes first: its
        known leader, else its preferred leader; "" (the per-shard path) if
        neither is known or the node did not answer lately."""
        addr = self._leader(group_id(table, shard))
        if not addr:
            reps = self._replica_addrs(table, shard)
            addr = reps[0] if reps else ""
        return "" if not addr or self._is_silent(addr) else addr

    def _spread_addr(self, table, shard):
        reps = [a for a in self._replica_addrs(table, shard) if not self._is_silent(a)]
        if not reps:
            return self._leader_of(table, shard)
        return random.choice(reps)

    def _next_seq(self, group):
        with self._mu:
            n = self._seqs.get(group, 0) + 1
            self._seqs[group] = n
            return n

    def _is_silent(self, addr):
        with self._mu:
            until = self._silent.get(addr)
            return until is not None and until > time.monotonic()

    def _failed_call(self, addr, e):
        """Mark a node that did not answer (the transport's own failure or a
        timeout, neither carrying a reason) so retries ask it last."""
        code = e.code() if hasattr(e, "code") else None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and errors.error_info(e) is None:
            with self._mu:
                self._silent[addr] = time.monotonic() + SILENT_FOR

    def _leader_named(self, addr):
        """A node that answered names addr as a leader: news that addr is
        up once it has been marked silent for LEADER_NEWS_AFTER, so the
        mark goes (marked, it was left out of every retry round for
        SILENT_FOR, and writes to the shards a restarted node led again
        stalled that long)."""
        with self._mu:
            until = self._silent.get(addr)
            if until is not None and time.monotonic() >= until - SILENT_FOR + LEADER_NEWS_AFTER:
                del self._silent[addr]

    def _order(self, addrs):
        """addrs without repeats, the nodes that did not answer lately last
        (and left out unless they are all there is)."""
        seen, live, silent = set(), [], []
        for a in addrs:
            if a and a not in seen:
                seen.add(a)
                (silent if self._is_silent(a) else live).append(a)
        return live or silent

    # --- retries --------------------------------------------------------

    def _shard_retry(self, table, shard, hint, single):
        def refresh(addr):
            try:
                self._describe(table, addr)
            except RaftpsError:
                try:
                    self._describe(table)
                except RaftpsError:
                    pass

        self._retry(group_id(table, shard), hint, lambda: self._replica_addrs(table, shard), refresh,
                    lambda addr, timeout: single(addr, self.stub(addr), shard, timeout))

    def _attempt(self, addr, fn, deadline):
        """One call of fn to addr, bounded by attempt_timeout and deadline;
        gRPC errors come out as RaftpsError."""
        timeout = max(0.001, min(self.attempt_timeout, deadline - time.monotonic()))
        try:
            fn(addr, timeout)
        except grpc.RpcError as e:
            self._failed_call(addr, e)
            raise errors.from_rpc_error(e) from None

    def _retry(self, group, hint, candidates, refresh, fn):
        """Call fn(addr, timeout) at candidate nodes until it succeeds, fails
        for good or retry_timeout passes: hint first, then the leader a
        NOT_LEADER answer names, then candidates() (re-read every round),
        then the configured addresses. A stale-map answer calls refresh(addr)
        before the next attempt. A success through a group makes the node
        its known leader."""
        deadline = time.monotonic() + self.retry_timeout
        backoff, nxt, redirected, last, rounds = 0.005, hint, False, None, 0
        while True:
            rounds += 1
            addrs = ([nxt] if nxt else []) + (candidates() if candidates else []) + self.addrs
            nxt = ""
            for addr in self._order(addrs):
                if time.monotonic() >= deadline:
                    break
                try:
                    self._attempt(addr, fn, deadline)
                except RaftpsError as err:
                    if not errors.retryable(err):
                        raise
                    last = err
                    if errors.stale(err) and refresh is not None:
                        refresh(addr)
                        c = candidates() if candidates else []
                        nxt = c[0] if c else ""
                        break
                    if err.leader_addr:
                        nxt = err.leader_addr
                        self._leader_named(nxt)
                        break
                    continue
                if group:
                    self._set_leader(group, addr)
                return
            now = time.monotonic()
            if now >= deadline:
                raise errors.UnavailableError(
                    f"raftps: gave up after {rounds} rounds in {self.retry_timeout:g}s (last error: {last})",
                    reason=last.reason if last else "", code=last.code if last else None) from last
            if nxt and not redirected:
                redirected = True
                continue
            time.sleep(min(backoff, deadline - now))
            backoff = min(2 * backoff, MAX_BACKOFF)


class _TableMap:
    """The client's copy of a table's placement: each shard's ShardMap (by
    shard) and the nodes' client addresses (by node ID)."""

    def __init__(self, n):
        self.shards = [None] * n
        self.addr = {}


class _PullOp:
    """One pull's parts: requests built from the split, answers placed in rows."""

    def __init__(self, c, table, sp, rows, base, spread):
        self.c, self.table, self.sp, self.rows, self.base, self.spread = c, table, sp, rows, base, spread

    def request(self, s):
        lo, hi = self.sp.range(s)
        return pb.PullRequest(shard=s, keys=self.sp.keys[lo:hi].tobytes(), epoch=self.c._epoch(self.table, s),
                              **self.base)

    def place(self, addr, s, values):
        lo, hi = self.sp.range(s)
        v = np.frombuffer(values, dtype="<f4")
        if v.size != (hi - lo) * self.rows.shape[1]:
            raise errors.UnavailableError(f"raftps: {addr} answered {len(values)} bytes for {hi - lo} rows of table {self.table!r}")
        self.rows[lo:hi] = v.reshape(hi - lo, -1)

    def batch_future(self, addr, stub, shards, timeout):
        req = pb.PullBatchRequest(parts=[self.request(s) for s in shards])
        return stub.PullBatch.future(req, timeout=timeout)

    def answered(self, addr, shards, resp):
        if len(resp.parts) != len(shards) or len(resp.errors) != len(shards):
            err = errors.UnavailableError(f"raftps: {addr} answered {len(resp.parts)} parts for {len(shards)}")
            return [(s, err) for s in shards]
        out = []
        for s, part, pe in zip(shards, resp.parts, resp.errors):
            if pe.code != 0:
                out.append((s, errors.from_part_error(pe)))
                continue
            try:
                self.place(addr, s, part.values)
                out.append((s, None))
            except RaftpsError as err:
                out.append((s, err))
        return out

    def single(self, addr, stub, s, timeout):
        self.place(addr, s, stub.Pull(self.request(s), timeout=timeout).values)

    def failed(self, shards):
        pass


def to_bf16(x):
    """float32 values → their nearest bfloat16 (ties to even) as
    little-endian uint16, the high half of each float32: what a push to a
    table of grad_precision "bf16" carries. The same rounding as the Go
    client's and the nodes' (store/bf16.go); x holds no NaN (push refuses
    those first)."""
    b = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2")


class _PushOp:
    """One push's parts. Each shard's request, with its (client, seq), is
    built once: every attempt, batched or not, sends it, so a retry is
    applied at most once."""

    def __init__(self, c, table, sp, sums, bf16=False):
        self.c, self.table, self.sp = c, table, sp
        self.reqs, self.sent = {}, {}
        for s in sp.shards():
            lo, hi = sp.range(s)
            self.reqs[s] = pb.PushRequest(table=table, shard=s, client_id=c.client_id,
                                          seq=c._next_seq(group_id(table, s)),
                                          keys=sp.keys[lo:hi].tobytes(), grads=sums[lo:hi].tobytes(),
                                          grads_bf16=bf16)
            # sent[s]: an earlier attempt may have reached a leader's log;
            # only a NOT_LEADER or stale-map refusal proves it did not.
            self.sent[s] = False

    def _request(self, s):
        r = self.reqs[s]
        r.epoch = self.c._epoch(self.table, s)
        return r

    def _duplicate(self, addr, s, dup):
        if dup and not self.sent[s]:
            r = self.reqs[s]
            raise errors.ClientIDReusedError(
                f"raftps: {addr} answered that push seq {r.seq} of client {r.client_id} was applied before, "
                f"but this client never sent it: another client uses client_id {r.client_id}")

    def _note(self, s, err):
        if err is None or not (err.reason == "NOT_LEADER" or errors.stale(err)):
            self.sent[s] = True

    def batch_future(self, addr, stub, shards, timeout):
        req = pb.PushBatchRequest(parts=[self._request(s) for s in shards])
        return stub.PushBatch.future(req, timeout=timeout)

    def answered(self, addr, shards, resp):
        if len(resp.parts) != len(shards) or len(resp.errors) != len(shards):
            self.failed(shards)
            err = errors.UnavailableError(f"raftps: {addr} answered {len(resp.parts)} parts for {len(shards)}")
            return [(s, err) for s in shards]
        out = []
        for s, part, pe in zip(shards, resp.parts, resp.errors):
            err = errors.from_part_error(pe) if pe.code != 0 else None
            if err is None:
                try:
                    self._duplicate(addr, s, part.duplicate)
                except RaftpsError as e:
                    err = e
            self._note(s, err)
            out.append((s, err))
        return out

    def single(self, addr, stub, s, timeout):
        try:
            resp = stub.Push(self._request(s), timeout=timeout)
        except grpc.RpcError as e:
            self._note(s, errors.from_rpc_error(e))
            raise
        self._duplicate(addr, s, resp.duplicate)

    def failed(self, shards):
        # A batch call that failed as a whole may have reached the node.
        for s in shards:
            self.sent[s] = True


def _same_table(want, have):
    """Whether the stored spec have is the one want asked for: every field
    want sets has have's value. The nodes spell an optimizer with all its
    hyper-parameters ("adagrad" is stored as "adagrad:lr=0.01,init_acc=0.1,
    eps=1e-07"), so those given must match and the rest are defaults."""
    for f, v in want.ListFields():
        h = getattr(have, f.name)
        if f.name in ("optimizer", "initializer"):
            if not _same_setting(v, h):
                return False
        elif h != v:
            return False
    return True


def _same_setting(want, have):
    """"name:k=v,..." (or "uniform:A") settings: same name, and every value
    want gives equal in have."""
    wn, _, wp = want.partition(":")
    hn, _, hp = have.partition(":")
    if wn != hn:
        return False
    if not wp:
        return True
    if "=" not in wp:  # uniform:A, normal:SIGMA
        try:
            return float(wp) == float(hp)
        except ValueError:
            return wp == hp
    hv = dict(kv.partition("=")[::2] for kv in hp.split(",") if kv)
    for kv in wp.split(","):
        k, _, v = kv.partition("=")
        try:
            if k not in hv or float(hv[k]) != float(v):
                return False
        except ValueError:
            return False
    return True
