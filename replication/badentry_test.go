package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/raftps/raftps/replication/internal/reptest"
)

// badCommands are log entries no replica can apply, of a table of dim 2:
// the reproductions of issue 22 (an entry declaring more pushes or rows than
// it holds, 2^62 pushes, truncated entries, unknown command types). The
// fuzz targets' seed corpora (testdata/fuzz) hold the same bytes.
func badCommands() []struct {
	name string
	cmd  []byte
} {
	good := encodePushBatch(7, []*Push{
		{Client: 1, Seq: 1, Keys: []uint64{1, 2}, Grads: []float32{1, 2, 3, 4}},
		{Client: 2, Seq: 1, Keys: []uint64{3}, Grads: []float32{5, 6}},
	})
	header := func(count uint64) []byte {
		b := append([]byte{cmdPush}, make([]byte, 8)...)
		return binary.AppendUvarint(b, count)
	}
	onePush := appendPush(nil, &Push{Client: 3, Seq: 9, Keys: []uint64{4}, Grads: []float32{1, 1}})
	manyKeys := binary.LittleEndian.AppendUint32(make([]byte, 16), math.MaxUint32)
	return []struct {
		name string
		cmd  []byte
	}{
		{"2^62 pushes", header(1 << 62)},
		{"3 pushes declared, 1 held", append(header(3), onePush...)},
		{"2^32-1 keys declared", append(header(1), append(manyKeys, make([]byte, 64)...)...)},
		{"truncated in the gradients", good[:len(good)-3]},
		{"truncated in a push header", good[:len(good)-30]},
		{"bytes after the last push", append(bytes.Clone(good), 0)},
		{"no count", good[:9]},
		{"overlong count", append(header(0)[:9], bytes.Repeat([]byte{0xff}, 11)...)},
		{"unknown command type", append([]byte{0x7f}, good[1:]...)},
		{"empty", []byte{}},
		{"noop with a tail", []byte{cmdNoop, 0}},
	}
}

// TestFSMRefusesBadEntriesWhole applies every bad entry to an FSM holding
// state: each is refused with ErrBadEntry, without a panic, and leaves rows
// and the dedupe record exactly as they were; a push inside a refused entry
// is not recorded, so the same push in a good entry applies.
func TestFSMRefusesBadEntriesWhole(t *testing.T) {
	f, err := NewFSM("g", reptest.SGDTable("t", 2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	applyCmd(t, f, 1, &Push{Client: 1, Seq: 1, Keys: []uint64{1, 2}, Grads: []float32{1, 2, 3, 4}})
	sum, dd := f.Table().Checksum(), f.dd.appendTo(nil)
	for _, bc := range badCommands() {
		res := f.ApplyCommand(bc.cmd)
		if !errors.Is(res.Err(), ErrBadEntry) {
			t.Fatalf("%s: refused with %v, want ErrBadEntry", bc.name, res.Err())
		}
		if len(res.outcomes) != 0 {
			t.Fatalf("%s: %d push outcomes of a refused entry", bc.name, len(res.outcomes))
		}
		if f.Table().Checksum() != sum || !bytes.Equal(f.dd.appendTo(nil), dd) {
			t.Fatalf("%s: the refused entry changed the state", bc.name)
		}
	}
	// The push held by "3 pushes declared, 1 held" was not recorded.
	res := applyCmd(t, f, 2, &Push{Client: 3, Seq: 9, Keys: []uint64{4}, Grads: []float32{1, 1}})
	if res.outcomes[0].err != nil || res.outcomes[0].duplicate {
		t.Fatalf("push of a refused entry, sent again: %+v", res.outcomes[0])
	}
}

// TestBatchAnswersBadEntryToEveryPush: when the entry a batch became is
// refused, each of its pushes is answered with that error (not left
// waiting, not told it was applied).
func TestBatchAnswersBadEntryToEveryPush(t *testing.T) {
	f, err := NewFSM("g", reptest.SGDTable("t", 2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	defer close(closed)
	q := NewBatcher(BatcherConfig{Who: "group g", MaxEntryBytes: 1 << 20, MaxInflight: 1, Closed: closed})
	errs := make(chan error, 2)
	for c := range uint64(2) {
		go func() {
			_, err := q.Submit(context.Background(), &Push{Client: c + 1, Seq: 1, Keys: []uint64{c}, Grads: []float32{1, 1}})
			errs <- err
		}()
	}
	for len(q.pushCh) < 2 { // both queued: Next takes them as one entry
		time.Sleep(time.Millisecond)
	}
	b, ok := q.Next()
	if !ok || len(b.pushes) != 2 {
		t.Fatalf("batch of %d pushes", len(b.pushes))
	}
	cmd := b.AppendCommand(nil, 1)
	b.Answer(f.ApplyCommand(cmd[:len(cmd)-1]))
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrBadEntry) {
			t.Fatalf("push of a refused entry answered %v, want ErrBadEntry", err)
		}
	}
	if f.Table().Len() != 0 {
		t.Fatalf("%d rows after a refused entry", f.Table().Len())
	}
}

// TestGroupSurvivesBadEntries commits every bad entry in a real three-replica
// group (raft-boltdb logs, raft applying them on each replica): no replica
// panics, each refuses them alike, good pushes keep committing, the
// replicas' checksums agree, and a full restart replays the log, bad
// entries included, to the same state.
func TestGroupSurvivesBadEntries(t *testing.T) {
	c := newGroupCluster(t, 3, fastConfig(reptest.SGDTable("t", 2)))
	w := reptest.NewWorkload(2)
	runWorkload(t, c, w, 2, 20)
	for _, bc := range badCommands() {
		g := c.live()[c.leader(5*time.Second)]
		fut := g.Raft().Apply(bc.cmd, 5*time.Second)
		if err := fut.Error(); err != nil {
			t.Fatalf("%s: not committed: %v", bc.name, err)
		}
		res, ok := fut.Response().(*ApplyResult)
		if !ok || !errors.Is(res.Err(), ErrBadEntry) {
			t.Fatalf("%s: answered %#v, want ErrBadEntry", bc.name, fut.Response())
		}
	}
	// The group keeps committing good pushes after them.
	rng := rand.New(rand.NewPCG(5, 5))
	for seq := range uint64(20) {
		p := &Push{Client: 100, Seq: seq + 1}
		p.Keys, p.Grads = w.Rows(rng)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.push(ctx, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		w.Acknowledge(p.Keys, p.Grads)
	}
	sum := c.waitConverged(10 * time.Second)
	w.Check(t, c.live()[0].Table())
	for i := range c.groups {
		c.stop(i)
	}
	for i := range c.groups {
		c.start(i, nil)
	}
	c.leader(5 * time.Second)
	if got := c.waitConverged(10 * time.Second); got != sum {
		t.Fatalf("after a restart replaying the bad entries: checksum %x, was %x", got, sum)
	}
}
