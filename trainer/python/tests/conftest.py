"""A real 3-node cluster of the raftps binary for the tests, on 127.0.0.1.

RAFTPS_BIN names the binary (make test-python builds bin/raftps and sets
it); RAFTPS_TEST_PORT the first client port (the cluster also uses +1, +2,
and those +100, +1000 and +2000). The cluster is started once per session
and removed at its end, whatever the tests did.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

import raftps  # noqa: E402


class Cluster:
    def __init__(self, binary, port):
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="raftps-pytest-")
        # A secure cluster, as cluster up makes it: a CA and certificates
        # under DIR/certs, and DIR/env pointing the CLI at the admin's.
        self.env = {}
        out = self.run("cluster", "up", "--dir", self.dir, "--base-port", str(port))
        self.addrs = [f"127.0.0.1:{port + i}" for i in range(3)]
        assert ",".join(self.addrs) in out, out
        self.env = read_env(os.path.join(self.dir, "env"))
        # The admin's credentials, for raftps.Client(**cluster.creds).
        self.creds = {"ca": self.env["RAFTPS_CA"], "cert": self.env["RAFTPS_CERT"], "key": self.env["RAFTPS_KEY"]}

    def run(self, *args, timeout=120):
        env = dict(os.environ)
        for k in ("RAFTPS_CA", "RAFTPS_CERT", "RAFTPS_KEY", "RAFTPS_TOKEN", "RAFTPS_INSECURE"):
            env.pop(k, None)
        env.update(self.env)
        p = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"raftps {' '.join(args)}: exit {p.returncode}: {p.stderr}{p.stdout}")
        return p.stdout

    def client(self, **kw):
        """A client with the admin's certificate (kw overrides)."""
        return raftps.Client(self.addrs, **{**self.creds, **kw})

    def node_of(self, addr):
        """The node ID (n1..n3) of a client address."""
        return f"n{self.addrs.index(addr) + 1}"

    def kill(self, node):
        """SIGKILL the node's process."""
        self.run("cluster", "kill", node, "--dir", self.dir)

    def restart(self, node):
        self.run("cluster", "restart", node, "--dir", self.dir)

    def down(self):
        try:
            self.run("cluster", "down", "--dir", self.dir)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def read_env(path):
    """The variables an env file of cluster up exports."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("export "):
                k, _, v = line[len("export "):].strip().partition("=")
                out[k] = v
    return out


@pytest.fixture(scope="session")
def cluster():
    binary = os.environ.get("RAFTPS_BIN") or os.path.join(REPO, "bin", "raftps")
    if not os.path.exists(binary):
        pytest.fail(f"no raftps binary at {binary}: run make build (or make test-python)")
    c = Cluster(binary, int(os.environ.get("RAFTPS_TEST_PORT", "17401")))
    yield c
    c.down()


@pytest.fixture
def client(cluster):
    # Generous timeouts: the suite shares a small machine with other work,
    # where elections and slow fsyncs stretch calls to seconds.
    c = cluster.client(retry_timeout=60.0, attempt_timeout=10.0)
    yield c
    c.close()


_n = [0]


@pytest.fixture
def table_name(request):
    """A fresh table name per test."""
    _n[0] += 1
    return f"py_{request.node.name.split('[')[0][:30]}_{_n[0]}_{int(time.time()) % 100000}"


def leader_of(client, table, shard, timeout=30.0):
    """The address of the shard's leader, once the cluster knows one (an
    election may be under way, on a loaded machine often)."""
    deadline = time.monotonic() + timeout
    while True:
        addr = client.describe_table(table).leaders.get(shard)
        if addr or time.monotonic() > deadline:
            assert addr, f"{table}/{shard} has had no leader for {timeout}s"
            return addr
        time.sleep(0.1)
