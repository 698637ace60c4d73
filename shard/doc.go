// Package shard will own the cluster: node wiring, the meta group and
// placement, consistent hashing, memberlist membership, failure repair and
// rebalancing, hot-key detection and read replicas, the gRPC services (protos in
// shard/shardpb), and shard.Client. It depends on store and replication. Not
// built yet: see the issues "A replicated table service" and "The elastic
// cluster", and ../shared/DESIGN.md.
package shard
