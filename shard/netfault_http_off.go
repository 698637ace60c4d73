//go:build !raftps_faultinject

package shard

import "net/http"

// FaultInjectionBuilt: a production build never serves /debug/netfault,
// whatever NodeConfig.FaultInjection says: an HTTP call that cuts a node
// off from its peers has no place on a production node. In-process tests
// use BlockPeers and SetDelay instead; binaries for the binary tests and
// raftps chaos of a local cluster are built with -tags raftps_faultinject
// (netfault_http_on.go).
const FaultInjectionBuilt = false

func (n *Node) serveNetFault(*http.ServeMux) {}
