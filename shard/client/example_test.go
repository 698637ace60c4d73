package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// cluster holds the client addresses of the 3-node cluster TestMain starts
// for the examples (main_test.go).
var cluster []string

// Create a table, push gradients, and pull the rows back: linearizable,
// then at the table's own level, bounded staleness.
func Example() {
	ctx := context.Background()
	c, err := client.New(client.DefaultConfig(cluster...))
	must(err)
	defer c.Close()
	_, err = c.Tables().Create(ctx, client.TableSpec{
		Name: "users", Dim: 4, Optimizer: "sgd:lr=0.5", Shards: 4,
		Consistency: client.Consistency{Level: client.Bounded, Bound: 100 * time.Millisecond},
	})
	must(err)
	keys := []uint64{7, 42}
	must(c.Push(ctx, "users", keys, []float32{1, 2, 3, 4, -1, -2, -3, -4}))
	rows := make([]float32, len(keys)*4)
	must(c.Pull(ctx, "users", keys, rows, client.WithConsistency(client.Linearizable)))
	fmt.Println("linearizable:", rows)
	// Any replica whose state is provably under 100ms old may answer this.
	must(c.Pull(ctx, "users", keys, rows))
	fmt.Println("bounded:", rows)
	// Output:
	// linearizable: [-0.5 -1 -1.5 -2 0.5 1 1.5 2]
	// bounded: [-0.5 -1 -1.5 -2 0.5 1 1.5 2]
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
