package api

import (
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

var updateVectors = flag.Bool("update-vectors", false, "rewrite testdata/shard_vectors.json from ShardOf")

// shardVectors is testdata/shard_vectors.json: keys with their Mix64 and
// their shard under several shard counts. Other clients (the Python one,
// trainer/python/tests) check their shard function against the same file,
// so a client that routes differently from the nodes fails a test instead
// of sending every push to the wrong leader. Keys and hashes are decimal
// strings: JSON numbers lose bits past 2^53 in many readers.
type shardVectors struct {
	Counts []uint32      `json:"counts"`
	Keys   []shardVector `json:"keys"`
}

type shardVector struct {
	Key    string   `json:"key"`
	Mix64  string   `json:"mix64"`
	Shards []uint32 `json:"shards"` // by Counts
}

const vectorsFile = "testdata/shard_vectors.json"

func makeVectors() shardVectors {
	v := shardVectors{Counts: []uint32{1, 2, 3, 4, 7, 8, 16, 64, 1000, 1<<32 - 1}}
	keys := []uint64{0, 1, 2, 63, 64, 1 << 32, 1<<53 + 1, 1 << 56, 1<<63 - 1, 1 << 63, 1<<64 - 1}
	r := rand.New(rand.NewPCG(26, 26))
	for range 200 {
		keys = append(keys, r.Uint64())
	}
	for _, k := range keys {
		sv := shardVector{Key: strconv.FormatUint(k, 10), Mix64: strconv.FormatUint(Mix64(k), 10)}
		for _, n := range v.Counts {
			sv.Shards = append(sv.Shards, ShardOf(k, n))
		}
		v.Keys = append(v.Keys, sv)
	}
	return v
}

// The committed vectors are what ShardOf computes: the function has not
// changed (it never may) and the file other clients test against is true.
func TestShardVectors(t *testing.T) {
	want := makeVectors()
	if *updateVectors {
		b, err := json.MarshalIndent(want, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var got shardVectors
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Keys) != len(want.Keys) || len(got.Counts) != len(want.Counts) {
		t.Fatalf("%s has %d keys and %d counts, want %d and %d (go test ./shard/api -run TestShardVectors -update-vectors)", vectorsFile, len(got.Keys), len(got.Counts), len(want.Keys), len(want.Counts))
	}
	for i, g := range got.Keys {
		k, err := strconv.ParseUint(g.Key, 10, 64)
		if err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
		if m := strconv.FormatUint(Mix64(k), 10); g.Mix64 != m {
			t.Errorf("key %d: file says Mix64 %s, Mix64 gives %s", k, g.Mix64, m)
		}
		for j, n := range got.Counts {
			if s := ShardOf(k, n); g.Shards[j] != s {
				t.Errorf("key %d of %d shards: file says shard %d, ShardOf gives %d", k, n, g.Shards[j], s)
			}
		}
	}
}
