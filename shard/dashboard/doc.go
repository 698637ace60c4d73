// Package dashboard owns the web page each node serves at "/" of its HTTP
// port: one self-contained HTML file (CSS, JavaScript and SVG charts
// inline, no external assets) built into the binary, and the JSON endpoint
// it polls. What the JSON holds is the node's business (a ViewFunc); the
// page draws nodes, tables with their shards' leaders, live rates and
// latencies, hot keys and jobs from it, and keeps the last minutes of
// history in the browser.
//
// Concurrency: Handler is safe for concurrent use; views are computed one
// at a time and cached for half a second.
package dashboard
