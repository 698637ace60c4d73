package client_test

import (
	"context"
	"errors"
	"testing"

	"github.com/raftps/raftps/shard/client"
)

// TestLargeCallsAreSplit: a push and a pull too large for one call of
// MaxCallBytes go as several, and nothing tells them apart from one call:
// a key pushed twice (in what become different calls) gets its gradients
// summed once, every row comes back in the caller's order, and a wrong
// dimension is still refused before anything is sent.
func TestLargeCallsAreSplit(t *testing.T) {
	ctx := context.Background()
	cfg := client.DefaultConfig(cluster...)
	const dim = 4
	cfg.MaxCallBytes = 10 * (8 + 4*dim) // 10 rows a call
	// Messages that fit 10 rows and not 95: a call that was not split
	// would be refused.
	cfg.MaxMessageBytes = 2048
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Tables().Create(ctx, client.TableSpec{Name: "split", Dim: dim, Optimizer: "sgd:lr=1", Initializer: "zeros", Shards: 1}); err != nil {
		t.Fatal(err)
	}
	// 95 keys, key k pushed with gradient -k in every column; keys 0..9
	// pushed a second time at the end, with -1000.
	var keys []uint64
	var grads []float32
	for k := range 95 {
		keys = append(keys, uint64(k))
		for range dim {
			grads = append(grads, -float32(k))
		}
	}
	for k := range 10 {
		keys = append(keys, uint64(k))
		for range dim {
			grads = append(grads, -1000)
		}
	}
	if err := c.Push(ctx, "split", keys, grads); err != nil {
		t.Fatal(err)
	}
	// Pulled backwards, in calls of 10 rows.
	pull := make([]uint64, 95)
	for i := range pull {
		pull[i] = uint64(94 - i)
	}
	rows := make([]float32, len(pull)*dim)
	if err := c.Pull(ctx, "split", pull, rows, client.WithConsistency(client.Linearizable)); err != nil {
		t.Fatal(err)
	}
	for i, k := range pull {
		want := float32(k) // sgd, lr 1: row = -gradient
		if k < 10 {
			want += 1000
		}
		for col := range dim {
			if got := rows[i*dim+col]; got != want {
				t.Fatalf("key %d col %d = %v, want %v", k, col, got, want)
			}
		}
	}
	if err := c.Push(ctx, "split", keys, grads[:len(grads)-1]); !errors.Is(err, client.ErrDimMismatch) {
		t.Errorf("push with a value short: %v, want ErrDimMismatch", err)
	}
	if err := c.Pull(ctx, "split", pull, rows[1:]); !errors.Is(err, client.ErrDimMismatch) {
		t.Errorf("pull into a short buffer: %v, want ErrDimMismatch", err)
	}
}
