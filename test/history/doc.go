// Package history records concurrent histories of pushes and pulls against
// embedding tables and checks them against the consistency the cluster
// promises.
//
// The package owns three things: the history format ([Op], written and read
// as JSON lines by [WriteFile] and [ReadFile] so a failing run can be kept
// and re-checked offline), the [Recorder] that builds a history while a
// workload runs, and the checkers ([CheckLinearizable], [CheckBounded],
// [CheckFinal]) that judge one.
//
// # Workload model
//
// The checkers rely on a workload that makes every row's value a pure
// function of which pushes were applied: tables start at zero, the optimiser
// is SGD with lr=1, and every push sends a small positive integer gradient,
// the same integer for every element of a row. Element 0 of a row is then
// exactly minus the sum of the gradients applied to that key, so the package
// works on int64 throughout: a push carries one positive gradient per key and
// a pull reports element 0 of each row it read. Because every gradient is
// positive, the observed value is monotone in the set of applied pushes,
// which is what lets the bounded and final checkers use plain sums and lets
// the final checker tell a lost push from a doubled one.
//
// Checks are per key. A push to several keys is not required to be atomic
// across keys, so it is checked as one independent push per key.
//
// # Outcomes
//
// An operation's [Outcome] says what the client learned: [OK] (it took
// effect, and a pull's values are valid), [Failed] (it certainly did not take
// effect, e.g. refused before reaching any replica) or [Unknown] (it may or
// may not have taken effect, e.g. a timeout). Operations still in flight when
// a history is taken are Unknown with Return == -1, which is also the right
// way to judge them: a client that crashed mid-call cannot know either.
//
// # Concurrency
//
// A [Recorder] and the [Pending] handles it returns are safe for concurrent
// use by any number of goroutines; each Pending must be completed at most
// once. The checkers are pure functions of their arguments: they neither
// retain nor modify the ops slice, so several may run on the same history at
// once. [CheckLinearizable] starts goroutines internally (porcupine checks
// keys in parallel) and waits for all of them before returning.
package history
