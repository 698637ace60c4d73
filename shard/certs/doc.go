// Package certs is raftps's certificate material: how identities are
// written into certificates, how a CA and node and client certificates are
// made and stored, and the TLS configurations a node's listeners and its
// dialers use, which pick renewed files up without a restart.
//
// # What it owns
//
//   - The identity format (identity.go): a certificate speaks for node ID
//     (URI SAN raftps://node/ID) or client NAME with a role (URI SAN
//     raftps://client/NAME?role=reader|writer|admin). The URI is all that is
//     read back; a certificate with none, or more than one, has no identity.
//     Roles are ordered: reader < writer < admin.
//   - Making material (create.go, files.go): an ECDSA P-256 CA that signs
//     end-entity certificates only; node certificates (server and client
//     authentication, DNS and IP SANs for the hosts the node is dialed by);
//     client certificates (client authentication only); the gossip key
//     (32 random bytes, base64). Files: ca.crt, ca.key, gossip.key,
//     node.ID.crt/.key, client.NAME.crt/.key; keys are 0600 from their
//     first byte, and nothing is overwritten unless asked. Ensure makes
//     what is missing of a cluster's set; NodeMaterial.Load opens a node's
//     from a directory or from files named one by one.
//   - Source (source.go): one party's CA file, certificate and key, checked
//     when read (signed by the CA, valid, the identity wanted) and read
//     again at most every CheckEvery on a handshake; a renewed pair that
//     does not check keeps the old one in use.
//   - TLS configurations (tlsconfig.go), TLS 1.3 only: the client listener
//     (client certificate optional, verified if given), the peer listener
//     (a node certificate required), and dialers (the server must be a node
//     of the CA valid for the host dialed and, given its ID, that node;
//     one configuration per dial, since TLS does not tell a dialer which
//     IP address it dialed).
//
// It imports the standard library only, so the Go client (shard/client)
// can load client material without linking any server machinery. What a
// verified identity may do is decided elsewhere: package shard/auth turns
// it into a caller on a gRPC context and checks roles and node identities.
//
// # Concurrency
//
// Functions that make material are not safe to run concurrently on one
// directory (two CreateNode calls for one ID race on its files). A Source
// is safe for concurrent use, and so are the tls.Configs it returns: they
// read its current material on every handshake, and at most one handshake
// at a time reads the files again.
package certs
