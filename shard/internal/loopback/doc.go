// Package loopback holds listeners for tests of network faults on
// 127.0.0.1. It is test support only: the product never imports it.
//
// AcceptAll's accepting goroutine ends when the test's cleanup closes the
// listener.
package loopback
