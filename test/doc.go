// Package test will hold the cluster harnesses (in-process, multi-process of
// the real binary, Docker compose) and the tests that span packages: fault
// injection and history checking. Tests confined to one package live beside
// that package. Not built yet: the first harness comes with the issue "A
// replicated table service".
package test
