// Package transportpb is generated from transport.proto: the gRPC service
// that carries hashicorp/raft's RPCs between the Raft groups of nodes.
// Edit the .proto file and run make proto.
//
// Messages are not safe for concurrent modification; the generated stubs
// are safe for concurrent use.
package transportpb
