// Package shardpb is generated from client.proto (service ParameterServer,
// the client API), peer.proto (service Peer, what nodes ask each other) and
// meta.proto (the metadata group's commands and snapshot). Edit the .proto
// files and run make proto; make proto-check fails when the generated code
// is stale. Field numbers are a wire and disk format: never reuse one.
//
// Messages are not safe for concurrent modification; the generated stubs
// are safe for concurrent use.
package shardpb
