package shard

import "github.com/raftps/raftps/shard/shardpb"

// diskStatus is the data disk's state for Status.
func (n *Node) diskStatus() *shardpb.DiskStatus {
	d := n.disk.State()
	return &shardpb.DiskStatus{FreeBytes: d.Free, TotalBytes: d.Total, MinFreeBytes: d.MinFree, Full: d.Full, Reason: d.Reason, ReserveReleased: d.ReserveReleased}
}
