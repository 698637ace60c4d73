// Command raftps is raftps's one binary. Each subcommand is wiring and flags
// only; the work lives in the packages (see docs/ARCHITECTURE.md).
//
// Each subcommand runs on the main goroutine; the goroutines it starts
// (servers, trainers, bench clients) belong to the package it calls, which
// ends them before returning or on the signal the subcommand handles.
package main
