"""The client over TLS against the secure cluster of conftest: credentials
as the CLI takes them, a client certificate or a bearer token with its
role, and nothing in plaintext unless asked for."""

import numpy as np
import pytest

import raftps
from raftps.client import channel_credentials

from conftest import read_env

NOCREDS = {"ca": "", "cert": "", "key": "", "token": ""}


def token_client(cluster, token, **kw):
    return raftps.Client(cluster.addrs, ca=cluster.creds["ca"], cert="", key="", token=token, **kw)


def test_credentials_are_checked_as_the_cli_checks_them(cluster, monkeypatch):
    for k in ("RAFTPS_CA", "RAFTPS_CERT", "RAFTPS_KEY", "RAFTPS_TOKEN", "RAFTPS_INSECURE"):
        monkeypatch.delenv(k, raising=False)
    ca, cert, key = cluster.creds["ca"], cluster.creds["cert"], cluster.creds["key"]
    for kw, want in [
        ({}, "no CA"),
        ({"ca": ca}, "no credential"),
        ({"ca": ca, "cert": cert}, "cert and key go together"),
        ({"ca": ca, "cert": cert, "key": key, "token": "rpst_x"}, "both a client certificate and a token"),
        ({"ca": ca, "insecure": True}, "insecure with credentials"),
    ]:
        with pytest.raises(ValueError, match=want):
            raftps.Client(cluster.addrs, **kw)
    # The environment of '. DIR/env' is enough.
    for k, v in read_env(cluster.dir + "/env").items():
        monkeypatch.setenv(k, v)
    assert channel_credentials() is not None
    with raftps.Client() as c:
        assert c.status(cluster.addrs[0])["addr"] == cluster.addrs[0]


def test_plaintext_is_refused_by_a_secure_cluster(cluster):
    with raftps.Client(cluster.addrs, insecure=True, retry_timeout=2.0, attempt_timeout=1.0, **NOCREDS) as c:
        with pytest.raises(raftps.UnavailableError):
            c.list_tables()


def test_token_roles_and_revocation(client, cluster, table_name):
    client.create_table(table_name, 4, optimizer="sgd:lr=1", initializer="zeros", shards=2)
    keys = np.array([1, 2, 3], dtype=np.uint64)
    reader_tok = cluster.run("token", "create", "--name", table_name[:40] + "-r", "--role", "reader").strip()
    writer_tok = cluster.run("token", "create", "--name", table_name[:40] + "-w", "--role", "writer").strip()
    assert reader_tok.startswith("rpst_")
    with token_client(cluster, writer_tok) as w, token_client(cluster, reader_tok) as r:
        w.push(table_name, keys, -np.ones((3, 4), dtype=np.float32))
        np.testing.assert_array_equal(r.pull(table_name, keys, consistency="linearizable"), np.ones((3, 4), dtype=np.float32))
        assert r.describe_table(table_name).spec.dim == 4
        with pytest.raises(raftps.PermissionDeniedError, match="needs role writer") as e:
            r.push(table_name, keys, np.ones((3, 4), dtype=np.float32))
        assert not isinstance(e.value, raftps.UnauthenticatedError)
        with pytest.raises(raftps.PermissionDeniedError, match="needs role admin"):
            w.create_table(table_name + "_w", 4)
        # The refused push changed nothing.
        np.testing.assert_array_equal(client.pull(table_name, keys, consistency="linearizable"), np.ones((3, 4), dtype=np.float32))

        cluster.run("token", "revoke", table_name[:40] + "-r")
        with pytest.raises(raftps.UnauthenticatedError, match="not valid"):
            r.pull(table_name, keys)

    wrong = writer_tok[:-1] + ("B" if writer_tok.endswith("A") else "A")
    with token_client(cluster, wrong, retry_timeout=5.0) as c:
        with pytest.raises(raftps.UnauthenticatedError, match="not valid"):
            c.pull(table_name, keys)
