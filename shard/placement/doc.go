// Package placement decides where the replicas of every shard live.
//
// # What it owns
//
// Place, a pure and deterministic function from the live nodes, the
// tables' shard and replica counts and the current map to each shard's
// ordered replica set (first = preferred leader): rendezvous hashing, then a
// bounded-load correction so that no node holds more than ceil(S·R/N)
// replicas or ceil(S/N)+1 leaders, keeping every current replica that fits
// so a join or leave moves about 1/N of them, and raising a node below
// floor(S·R/N) replicas or floor(S/N) leaders (one that just joined) to its
// share. Moves counts what a change of placement costs: the replicas to
// copy and the leaders that change.
//
// The metadata leader's scheduler (package shard) calls Place when a table is
// created and on every scheduling round, and carries out the difference one
// shard step at a time; it is the only caller that turns a Placement into
// cluster map changes.
//
// # Concurrency and determinism
//
// No state, no I/O, no clock, no randomness: the result depends only on the
// arguments (not on their order), so every node computing it from the same
// map gets the same answer. Place and Moves are safe for concurrent use and
// do not modify their arguments.
package placement
