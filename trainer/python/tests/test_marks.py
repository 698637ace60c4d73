"""A node the client marked silent is asked again once the nodes that
answer name it as a leader long enough after the mark (the Go client's
leaderNamed)."""

import raftps.client as client_mod
from raftps.client import LEADER_NEWS_AFTER, SILENT_FOR, Client


def test_leader_named_lifts_only_an_older_silent_mark(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: now[0])
    c = Client(["127.0.0.1:1"], insecure=True)
    try:
        c._silent["n1"] = now[0] + SILENT_FOR
        c._leader_named("n1")
        assert c._is_silent("n1"), "news right after the mark may be stale: the mark stays"
        now[0] += LEADER_NEWS_AFTER
        c._leader_named("n1")
        assert not c._is_silent("n1"), "news half a second after the mark lifts it"
        c._leader_named("n2")  # never marked: nothing to lift
        assert not c._is_silent("n2")
    finally:
        c.close()
