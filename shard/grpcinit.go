package shard

import "github.com/raftps/raftps/shard/grpcopt"

// grpc's default buffer pool clears every buffer it hands out; a server
// process takes grpcopt's, which does not (see grpcopt.Install). At init,
// because grpc allows it only before any connection or server exists.
func init() { grpcopt.Install() }
