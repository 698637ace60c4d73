// Package client is the Go client of a raftps cluster: what a trainer, a
// tool or a service imports to pull and push embedding rows, manage tables,
// read the cluster's status and rendezvous in training jobs.
//
//	c, err := client.New(client.DefaultConfig("127.0.0.1:7001", "127.0.0.1:7002"))
//	...
//	err = c.Push(ctx, "users", keys, grads)
//	err = c.Pull(ctx, "users", keys, rows, client.WithConsistency(client.Eventual))
//
// The client routes every key to its shard (api.ShardOf), splits a batch by
// shard and sends one call per node that serves some of its shards, puts
// the rows back in the caller's order, and retries through leader changes
// and map moves. Every push carries (client ID, sequence number): a push
// whose outcome was unknown (a timeout, a leader change) is retried with
// the same pair and applied at most once. Linearizable pulls go to shard
// leaders; bounded and eventual pulls are spread over the replicas and the
// hot keys' read replicas. Every pull and push goes through one fan-out
// (fanout.go), so a dead, frozen or cut-off node is handled alike at every
// level: a call unanswered past Config.SuspectAfter asks two other nodes
// when they last heard from it, and is abandoned (and retried elsewhere)
// once they say it has gone silent.
//
// A cluster is secure by default: give the client its credentials (the
// CA, and a client certificate or a bearer token) through Credentials, or
// take the ones the CLI uses from the environment:
//
//	cfg := client.DefaultConfig(addrs...)
//	creds, err := client.CredentialsFromEnv().DialOptions()
//	cfg.DialOptions = append(cfg.DialOptions, creds...)
//
// Tables, Admin and Jobs group the table, cluster and job-registry calls.
// The API speaks this package's types; Raw is the escape hatch to the
// generated gRPC stub (package shardpb) for anything it does not wrap.
//
// It depends on no server code: not hashicorp/raft, raft-boltdb, bbolt or
// memberlist (a test keeps it so).
//
// # Concurrency
//
// A Client and its sub-APIs are safe for concurrent use. The caches (table
// specs, shard maps, leaders, hot sets, silent nodes, connections) are
// guarded by Client.mu, never held across a call; sequence numbers are
// atomics per shard. A pull or push runs its calls on goroutines it waits
// for; the only goroutines that outlive a call are background refreshes of
// a table's spec or hot sets, which end within seconds (bounded by their
// own timeouts) and start no new ones once the client is closed. A pull's
// answers stay in the messages gRPC received (pullcodec.go) until the pull
// has copied its rows out; the pull's answers value, under its own mutex,
// frees them then, and frees at once a message that arrives later (a
// hedge's), so no received buffer outlives the pull that asked for it.
package client
