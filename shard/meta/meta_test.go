package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/raftps/raftps/shard/api"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// metaLog feeds commands to a FSM as raft would, one index after another.
type metaLog struct {
	t     *testing.T
	m     *FSM
	index uint64
}

func newMetaLog(t *testing.T) *metaLog {
	return &metaLog{t: t, m: New(func() {})}
}

func (l *metaLog) apply(cmd byte, arg proto.Message) any {
	l.t.Helper()
	b, err := Encode(cmd, arg)
	if err != nil {
		l.t.Fatal(err)
	}
	l.index++
	return l.m.Apply(&raft.Log{Index: l.index, Term: 1, Type: raft.LogCommand, Data: b})
}

func (l *metaLog) join(job string, world, rank int, addr string) (int, uint64, error) {
	l.t.Helper()
	out := l.apply(CmdJoinJob, &shardpb.JoinJobRequest{Job: job, World: uint32(world), Rank: int32(rank), Addr: addr})
	if err, ok := out.(error); ok {
		return 0, 0, err
	}
	resp := out.(*shardpb.JoinJobResponse)
	return int(resp.Rank), resp.Round, nil
}

// mustJoin joins and checks the rank and round the join got.
func (l *metaLog) mustJoin(job string, world, rank int, addr string, wantRank int, wantRound uint64) {
	l.t.Helper()
	r, round, err := l.join(job, world, rank, addr)
	if err != nil {
		l.t.Fatalf("join %s world %d rank %d: %v", addr, world, rank, err)
	}
	if r != wantRank || round != wantRound {
		l.t.Fatalf("join %s world %d rank %d: got rank %d round %d, want rank %d round %d", addr, world, rank, r, round, wantRank, wantRound)
	}
}

// members renders a job's round as "round world: rank=addr ...", for
// comparisons.
func members(j *shardpb.Job) string {
	if j == nil {
		return "<none>"
	}
	s := fmt.Sprintf("%d %d:", j.Round, j.World)
	for _, m := range j.Members {
		s += fmt.Sprintf(" %d=%s", m.Rank, m.Addr)
	}
	return s
}

func (l *metaLog) wantJob(job, want string) {
	l.t.Helper()
	if got := members(l.m.Job(job)); got != want {
		l.t.Fatalf("job %s: got %q, want %q", job, got, want)
	}
}

func TestMetaJobAssignsLowestFreeRank(t *testing.T) {
	l := newMetaLog(t)
	l.mustJoin("j", 4, -1, "a", 0, 1)
	l.mustJoin("j", 4, 2, "c", 2, 1)
	l.mustJoin("j", 4, -1, "b", 1, 1) // the gap below c
	l.wantJob("j", "1 4: 0=a 1=b 2=c")
	if JobComplete(l.m.Job("j")) {
		t.Fatal("3 of 4 ranks: complete")
	}
	l.mustJoin("j", 4, -1, "d", 3, 1) // the only rank left
	if !JobComplete(l.m.Job("j")) {
		t.Fatal("4 of 4 ranks: not complete")
	}
	// Another job is independent.
	l.mustJoin("k", 2, 1, "a", 1, 1)
	l.wantJob("k", "1 2: 1=a")
}

func TestMetaJobExplicitRankTaken(t *testing.T) {
	l := newMetaLog(t)
	l.mustJoin("j", 3, 1, "a", 1, 1)
	if _, _, err := l.join("j", 3, 1, "b"); !errors.Is(err, api.ErrRankTaken) {
		t.Fatalf("rank 1 held by a, b asks for it: %v, want api.ErrRankTaken", err)
	}
	// a holds rank 1; it cannot switch to another rank of the same round.
	if _, _, err := l.join("j", 3, 2, "a"); !errors.Is(err, api.ErrRankTaken) {
		t.Fatalf("a holds rank 1 and asks for rank 2: %v, want api.ErrRankTaken", err)
	}
	l.wantJob("j", "1 3: 1=a") // refused joins change nothing
	l.mustJoin("j", 3, -1, "b", 0, 1)
}

func TestMetaJobRejoinIsIdempotent(t *testing.T) {
	l := newMetaLog(t)
	l.mustJoin("j", 2, -1, "a", 0, 1)
	l.mustJoin("j", 2, -1, "a", 0, 1)
	l.mustJoin("j", 2, 0, "a", 0, 1)
	l.wantJob("j", "1 2: 0=a")
	l.mustJoin("j", 2, -1, "b", 1, 1)
	// In a complete round too: a member asking again (a retried join whose
	// answer was lost) does not start a new round.
	l.mustJoin("j", 2, -1, "b", 1, 1)
	l.mustJoin("j", 2, 1, "b", 1, 1)
	l.wantJob("j", "1 2: 0=a 1=b")
}

func TestMetaJobNewRoundAfterComplete(t *testing.T) {
	l := newMetaLog(t)
	l.mustJoin("j", 2, -1, "a", 0, 1)
	l.mustJoin("j", 2, -1, "b", 1, 1)
	// A restarted trainer at a new address re-forms the job; it alone is in
	// round 2, at the rank it asks for.
	l.mustJoin("j", 2, 1, "b2", 1, 2)
	l.wantJob("j", "2 2: 1=b2")
	// a was in round 1, not 2: it joins round 2 and takes the free rank.
	l.mustJoin("j", 2, -1, "a", 0, 2)
	l.wantJob("j", "2 2: 0=a 1=b2")
	// A member of the complete round 2 asking with another world size starts
	// round 3 of that size.
	l.mustJoin("j", 3, -1, "a", 0, 3)
	l.wantJob("j", "3 3: 0=a")
}

func TestMetaJobWorldMismatch(t *testing.T) {
	l := newMetaLog(t)
	l.mustJoin("j", 3, -1, "a", 0, 1)
	for _, addr := range []string{"b", "a"} {
		if _, _, err := l.join("j", 4, -1, addr); !errors.Is(err, api.ErrWorldMismatch) {
			t.Fatalf("%s asks for world 4 in an incomplete round of 3: %v, want api.ErrWorldMismatch", addr, err)
		}
	}
	l.wantJob("j", "1 3: 0=a")
	l.mustJoin("j", 3, -1, "b", 1, 1)
	l.mustJoin("j", 3, -1, "c", 2, 1)
	// Complete: a newcomer may resize the job.
	l.mustJoin("j", 2, 1, "d", 1, 2)
	l.wantJob("j", "2 2: 1=d")
}

func TestMetaJobValidation(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, c := range []struct {
		name        string
		job         string
		world, rank int
		addr        string
	}{
		{"empty job", "", 2, -1, "a"},
		{"long job", long[:api.MaxJobNameLen+1], 2, -1, "a"},
		{"non-UTF-8 job", "j\xff", 2, -1, "a"},
		{"world 0", "j", 0, -1, "a"},
		{"world too large", "j", api.MaxJobWorld + 1, -1, "a"},
		{"rank below -1", "j", 2, -2, "a"},
		{"rank = world", "j", 2, 2, "a"},
		{"empty addr", "j", 2, -1, ""},
		{"long addr", "j", 2, -1, long[:api.MaxJobAddrLen+1]},
	} {
		if err := api.CheckJoin(c.job, c.world, c.rank, c.addr); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%s: api.CheckJoin: %v, want api.ErrBadRequest", c.name, err)
		}
		// Apply checks the log entry again, in case another writer did not.
		// (Invalid UTF-8 cannot be encoded in a proto string at all.)
		if !strings.Contains(c.name, "UTF-8") {
			l := newMetaLog(t)
			if _, _, err := l.join(c.job, c.world, c.rank, c.addr); !errors.Is(err, api.ErrBadRequest) {
				t.Errorf("%s: Apply: %v, want api.ErrBadRequest", c.name, err)
			}
			if len(l.m.JobList()) != 0 {
				t.Errorf("%s: a refused join created a job", c.name)
			}
		}
	}
	if err := api.CheckJoin("j", api.MaxJobWorld, api.MaxJobWorld-1, long[:api.MaxJobAddrLen]); err != nil {
		t.Errorf("limits themselves refused: %v", err)
	}
}

func TestMetaJobDelete(t *testing.T) {
	l := newMetaLog(t)
	if err, _ := l.apply(CmdDeleteJob, &shardpb.DeleteJobRequest{Job: "j"}).(error); !errors.Is(err, api.ErrUnknownJob) {
		t.Fatalf("deleting an unknown job: %v, want api.ErrUnknownJob", err)
	}
	l.mustJoin("j", 1, -1, "a", 0, 1)
	l.mustJoin("j", 1, -1, "b", 0, 2)
	if out := l.apply(CmdDeleteJob, &shardpb.DeleteJobRequest{Job: "j"}); out != nil {
		t.Fatalf("deleting j: %v", out)
	}
	l.wantJob("j", "<none>")
	l.mustJoin("j", 1, -1, "a", 0, 1) // a new job, from round 1
}

func TestMetaUnknownCommand(t *testing.T) {
	m := New(func() {})
	for _, data := range [][]byte{nil, {99, 1, 2}} {
		if _, ok := m.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: data}).(error); !ok {
			t.Errorf("command %v: no error", data)
		}
	}
}

// snapshotBytes returns what the FSM's snapshot persists.
func snapshotBytes(t *testing.T, m *FSM) []byte {
	t.Helper()
	snap, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(snap.(fsmSnapshot))
}

func restore(m *FSM, b []byte) error {
	return m.Restore(io.NopCloser(bytes.NewReader(b)))
}

// TestMetaJobApplyDeterministic: replicas applying the same log hold the same
// state to the byte, whatever the interleaving of joins, refusals and
// deletions in it.
func TestMetaJobApplyDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := newMetaLog(t), newMetaLog(t)
	for range 2000 {
		job := []string{"j1", "j2", "j3"}[rng.IntN(3)]
		if rng.IntN(50) == 0 {
			req := &shardpb.DeleteJobRequest{Job: job}
			a.apply(CmdDeleteJob, req)
			b.apply(CmdDeleteJob, req)
			continue
		}
		world := 2 + rng.IntN(3)
		req := &shardpb.JoinJobRequest{Job: job, World: uint32(world), Rank: int32(rng.IntN(world+1) - 1), Addr: string(rune('a' + rng.IntN(8)))}
		ra, rb := a.apply(CmdJoinJob, req), b.apply(CmdJoinJob, req)
		if ea, ok := ra.(error); ok {
			if eb, ok := rb.(error); !ok || ea.Error() != eb.Error() {
				t.Fatalf("%v: %v on one replica, %v on the other", req, ra, rb)
			}
		} else if !proto.Equal(ra.(proto.Message), rb.(proto.Message)) {
			t.Fatalf("%v: %v on one replica, %v on the other", req, ra, rb)
		}
	}
	if !bytes.Equal(snapshotBytes(t, a.m), snapshotBytes(t, b.m)) {
		t.Fatal("replicas that applied the same log have different snapshots")
	}
	for _, j := range a.m.JobList() {
		if len(j.Members) > int(j.World) {
			t.Fatalf("job %s round %d: %d members of %d ranks", j.Name, j.Round, len(j.Members), j.World)
		}
		for i := 1; i < len(j.Members); i++ {
			if j.Members[i-1].Rank >= j.Members[i].Rank {
				t.Fatalf("job %s: members not sorted by rank: %v", j.Name, j.Members)
			}
		}
	}
}

func TestMetaSnapshotRoundTrip(t *testing.T) {
	l := newMetaLog(t)
	for _, name := range []string{"users", "items"} {
		if out := l.apply(CmdCreateTable, &shardpb.TableSpec{Name: name, Dim: 8, Shards: 2, Replicas: 3}); out == nil {
			t.Fatal("no spec back")
		} else if err, ok := out.(error); ok {
			t.Fatal(err)
		}
	}
	l.mustJoin("train", 3, -1, "h0:1", 0, 1)
	l.mustJoin("train", 3, 2, "h2:1", 2, 1)
	l.mustJoin("eval", 1, -1, "h9:1", 0, 1)
	l.mustJoin("eval", 1, -1, "h8:1", 0, 2)

	b := snapshotBytes(t, l.m)
	if got := binary.LittleEndian.Uint32(b); got != snapshotMarker {
		t.Fatalf("snapshot starts with %#x, not the format marker", got)
	}
	changed := 0
	m := New(func() { changed++ })
	m.jobs["stale"] = &shardpb.Job{Name: "stale", World: 1, Round: 1} // replaced, not merged
	if err := restore(m, b); err != nil {
		t.Fatal(err)
	}
	if changed != 1 {
		t.Errorf("onChange called %d times, want 1", changed)
	}
	for _, pair := range []struct{ got, want []proto.Message }{
		{msgs(m.List()), msgs(l.m.List())},
		{msgs(m.JobList()), msgs(l.m.JobList())},
	} {
		if len(pair.got) != len(pair.want) {
			t.Fatalf("restored %d, want %d: %v", len(pair.got), len(pair.want), pair.got)
		}
		for i := range pair.got {
			if !proto.Equal(pair.got[i], pair.want[i]) {
				t.Errorf("restored %v, want %v", pair.got[i], pair.want[i])
			}
		}
	}
	if !bytes.Equal(snapshotBytes(t, m), b) {
		t.Error("a restored FSM's snapshot differs from the one it was restored from")
	}
	// The restored registry goes on where it was.
	l2 := &metaLog{t: t, m: m, index: l.index}
	l2.mustJoin("train", 3, -1, "h1:1", 1, 1)
	l2.mustJoin("eval", 1, -1, "h8:1", 0, 2)
}

func msgs[M proto.Message](in []M) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

// TestMetaRestoreFormat1: a snapshot written before the job registry existed
// (tables only: count, then length-prefixed specs) restores its tables, and
// no jobs.
func TestMetaRestoreFormat1(t *testing.T) {
	specs := []*shardpb.TableSpec{{Name: "a", Dim: 4, Shards: 1, Replicas: 3}, {Name: "b", Dim: 16, Shards: 8, Replicas: 3, Optimizer: "adagrad"}}
	old := binary.LittleEndian.AppendUint32(nil, uint32(len(specs)))
	for _, s := range specs {
		enc, err := deterministic.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		old = binary.LittleEndian.AppendUint32(old, uint32(len(enc)))
		old = append(old, enc...)
	}
	m := New(func() {})
	m.jobs["j"] = &shardpb.Job{Name: "j", World: 1, Round: 1}
	if err := restore(m, old); err != nil {
		t.Fatal(err)
	}
	got := m.List()
	if len(got) != 2 || !proto.Equal(got[0], specs[0]) || !proto.Equal(got[1], specs[1]) {
		t.Fatalf("restored tables %v, want %v", got, specs)
	}
	if jobs := m.JobList(); len(jobs) != 0 {
		t.Fatalf("restored jobs %v from a snapshot without any", jobs)
	}
	// An empty table list of format 1 as well.
	if err := restore(m, binary.LittleEndian.AppendUint32(nil, 0)); err != nil || len(m.List()) != 0 {
		t.Fatalf("empty format 1 snapshot: %v, %d tables", err, len(m.List()))
	}
}

func TestMetaRestoreRefusesBadSnapshots(t *testing.T) {
	header := func(format uint32) []byte {
		b := binary.LittleEndian.AppendUint32(nil, snapshotMarker)
		return binary.LittleEndian.AppendUint32(b, format)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, store.ErrCorruptSnapshot},
		{"format 1 truncated", []byte{2, 0, 0, 0, 5, 0, 0, 0, 1}, store.ErrCorruptSnapshot},
		{"marker alone", header(0)[:6], store.ErrCorruptSnapshot},
		{"format 4", header(4), store.ErrSnapshotVersion},
		{"format 2 garbage", append(header(2), 0xff, 0xff), store.ErrCorruptSnapshot},
	} {
		m := New(func() {})
		m.jobs["j"] = &shardpb.Job{Name: "j", World: 1, Round: 1}
		if err := restore(m, c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if m.Job("j") == nil {
			t.Errorf("%s: a refused snapshot changed the state", c.name)
		}
	}
}
