//go:build raftps_faultinject

package shard

import "net/http"

// FaultInjectionBuilt: this build may serve /debug/netfault (tests and
// chaos builds: -tags raftps_faultinject). See netfault_http_off.go.
const FaultInjectionBuilt = true

// serveNetFault serves /debug/netfault, through which raftps chaos and the
// binary tests partition and slow the nodes of a local cluster.
func (n *Node) serveNetFault(mux *http.ServeMux) {
	if n.fault != nil {
		mux.Handle("/debug/netfault", n.fault)
	}
}
