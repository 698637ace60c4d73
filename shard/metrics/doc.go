// Package metrics owns a node's Prometheus metrics: its registry (each node
// has its own, as tests run several nodes in one process), the interceptor
// that counts and times client API calls, and the collector that turns the
// node's status into gauges at scrape time. Label values are bounded by
// what the node holds (tables, shards, methods, error reasons, roles):
// no key, client or address is ever a label. docs/OPERATIONS.md
// ("Watching") lists every family.
//
// Concurrency: everything here is safe for concurrent use; the collector
// asks the node for its status once per scrape.
package metrics
