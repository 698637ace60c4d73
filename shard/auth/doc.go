// Package auth decides who may call what on a node: it authenticates the
// callers of both gRPC listeners and authorizes their calls.
//
// # What it owns
//
//   - Gate (gate.go): a listener's transport credentials and interceptors
//     (Gate.ServerOptions). The client gate (NewClientGate) takes a client
//     certificate or a bearer token, never both and never a node's
//     certificate, and lets a call through if the caller's role is at
//     least the method's (MinRole, roles.go: one table of every client
//     method; a method missing from it is refused to all). The peer gate
//     (NewPeerGate) takes node certificates only. Both put the caller on
//     the context (Principal, FromContext) and answer refusals with
//     Unauthenticated or PermissionDenied and a message naming the caller,
//     the method and the role or identity it lacks.
//   - The per-message checks of the peer API's handlers (principal.go):
//     NodeID, RequireNode (the message claims to come from this node),
//     RequireMember (the caller belongs to this group, chain or map; the
//     membership data stays with the caller, passed in as a function).
//   - Bearer tokens (token.go): the format rpst_ID_SECRET, NewToken, the
//     record the cluster stores (SHA-256 of the secret, never the secret),
//     VerifyToken against a TokenStore, and BearerToken call credentials.
//   - Dial credentials (creds.go): ClientCredentials for clients,
//     NodeCredentials for nodes, which also check that the node answering
//     at a peer address is the node the cluster map puts there.
//   - Coalesced (coalesce.go): every TLS credential here (the gates' and
//     the dial credentials) sends the records of one gRPC write to the
//     socket in one write instead of one write a record.
//
// Certificates, their identities and the TLS configurations are package
// shard/certs's; this package reads identities only from chains that TLS
// verified. It imports no Raft, bolt or memberlist, so the Go client may
// use its dial and token credentials.
//
// # Concurrency
//
// A Gate is immutable once made and safe for concurrent use; its
// interceptors run on the calls' goroutines and block on nothing but the
// TokenStore, which must be safe for concurrent use. The checks of
// principal.go read the context only. A coalesced connection takes one
// write at a time through TLS (a mutex; gRPC has one writer per
// connection anyway); writes TLS makes from its read side meet the held
// records under the socket wrapper's mutex and go out after them.
package auth
