package test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
)

// TestClusterSurvivesBadLogEntries commits entries no replica can apply in
// a real three-node cluster (gRPC on loopback, raft-boltdb logs): in a shard
// group (2^62 pushes declared in no bytes, more pushes or keys than the
// entry holds, an unknown command type, an empty entry) and in the metadata
// group (an unknown command, a table of 2^32-1 shards), proposed as raw
// bytes on the leaders, as a buggy leader would. Afterwards: no node
// panicked, every replica refused each entry alike, good pushes keep
// committing, nothing acknowledged is lost or doubled and the replicas'
// checksums equal a single-node reference; and a restart of every node
// replays the logs, bad entries included, to the same state.
func TestClusterSurvivesBadLogEntries(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	spec, err := c.Client().Tables().Create(context.Background(), counterSpec("emb", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "emb", 2, 20, nil)

	header := func(count uint64) []byte {
		return binary.AppendUvarint(append([]byte{1}, make([]byte, 8)...), count)
	}
	push := binary.LittleEndian.AppendUint32(make([]byte, 16), 1) // client 0, seq 0, 1 key...
	push = append(push, make([]byte, 8+2*4)...)                   // ... and its key and row
	manyKeys := binary.LittleEndian.AppendUint32(make([]byte, 16), math.MaxUint32)
	for _, bad := range [][]byte{header(1 << 62), append(header(3), push...), append(header(1), manyKeys...), {0x7f, 1}, {}} {
		g := c.Node(c.Leader("emb", 0, 5*time.Second)).Group("emb", 0)
		fut := g.Raft().Apply(bad, 5*time.Second)
		if err := fut.Error(); err != nil {
			t.Fatalf("entry %x not committed: %v", bad, err)
		}
		res, ok := fut.Response().(*replication.ApplyResult)
		if !ok || !errors.Is(res.Err(), replication.ErrBadEntry) {
			t.Fatalf("entry %x answered %#v, want ErrBadEntry", bad, fut.Response())
		}
	}
	huge, err := meta.Encode(meta.CmdCreateTable, &shardpb.TableSpec{Name: "huge", Dim: 2, Shards: math.MaxUint32})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]byte{{0x7f}, huge} {
		var fut interface {
			Error() error
			Response() any
		}
		c.WaitMetaLeader(10 * time.Second)
		for i := range 3 {
			if n := c.Node(i); n != nil && n.MetaRaft().State().String() == "Leader" {
				fut = n.MetaRaft().Apply(bad, 5*time.Second)
			}
		}
		if fut == nil {
			t.Fatal("no metadata leader")
		}
		if err := fut.Error(); err != nil {
			t.Fatalf("metadata entry not committed: %v", err)
		}
		if _, refused := fut.Response().(error); !refused {
			t.Fatalf("metadata entry %x answered %v, want an error", bad[:1], fut.Response())
		}
	}

	pushLoad(t, c, l, "emb", 2, 20, nil)
	verify(t, c, l, "emb")
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Start(i)
	}
	c.WaitMetaLeader(10 * time.Second)
	verify(t, c, l, "emb")
	tabs, err := c.Client().Tables().List(context.Background())
	if err != nil || len(tabs) != 1 {
		t.Fatalf("after the restart the cluster lists %v (%v), want emb alone", tabs, err)
	}
}
