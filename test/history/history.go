package history

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Kind says whether an operation wrote or read.
type Kind uint8

const (
	// Push starts at 1 so that a zero Kind, e.g. from a hand-built Op that
	// forgot the field, is rejected instead of silently read as a push.
	Push Kind = iota + 1
	Pull
)

func (k Kind) String() string {
	switch k {
	case Push:
		return "push"
	case Pull:
		return "pull"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText keeps history files readable by a human.
func (k Kind) MarshalText() ([]byte, error) {
	switch k {
	case Push, Pull:
		return []byte(k.String()), nil
	}
	return nil, fmt.Errorf("history: invalid kind %d", uint8(k))
}

func (k *Kind) UnmarshalText(b []byte) error {
	switch string(b) {
	case "push":
		*k = Push
	case "pull":
		*k = Pull
	default:
		return fmt.Errorf("history: invalid kind %q", b)
	}
	return nil
}

// Outcome is what the client learned about an operation's effect.
type Outcome uint8

const (
	// Unknown is the zero value because an operation that has not returned
	// yet is, for every checker, exactly an operation of unknown effect.
	Unknown Outcome = iota
	// OK: the operation took effect; a pull's Values are what it observed.
	OK
	// Failed: the operation certainly did not take effect.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Unknown:
		return "unknown"
	case OK:
		return "ok"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

func (o Outcome) MarshalText() ([]byte, error) {
	switch o {
	case Unknown, OK, Failed:
		return []byte(o.String()), nil
	}
	return nil, fmt.Errorf("history: invalid outcome %d", uint8(o))
}

func (o *Outcome) UnmarshalText(b []byte) error {
	switch string(b) {
	case "unknown":
		*o = Unknown
	case "ok":
		*o = OK
	case "failed":
		*o = Failed
	default:
		return fmt.Errorf("history: invalid outcome %q", b)
	}
	return nil
}

// Op is one client operation. Keys, Grads and Values are parallel slices.
type Op struct {
	Client int  `json:"client"`
	Kind   Kind `json:"kind"`
	// Keys may repeat; each occurrence is checked on its own.
	Keys []uint64 `json:"keys"`
	// Grads holds, for a push, one positive gradient per key.
	Grads []int64 `json:"grads,omitempty"`
	// Values holds, for a pull with Outcome OK, element 0 of each key's row:
	// minus the sum of the gradients applied to that key.
	Values []int64 `json:"values,omitempty"`
	// Call and Return are nanoseconds since the recorder started, read from
	// the monotonic clock so wall-clock steps cannot reorder operations.
	// Return is -1 while the operation has not returned.
	Call    int64   `json:"call"`
	Return  int64   `json:"return"`
	Outcome Outcome `json:"outcome"`
	// Level is informational only, e.g. "linearizable" or "bounded:100ms";
	// the caller decides which checker applies to which ops.
	Level string `json:"level,omitempty"`
	// Error is why a failed or unknown operation failed, as its caller saw
	// it: for reading a history, not for the checkers.
	Error string `json:"error,omitempty"`
}

func (op Op) String() string {
	s := fmt.Sprintf("c%d %s keys=%v", op.Client, op.Kind, op.Keys)
	if op.Kind == Push {
		s += fmt.Sprintf(" grads=%v", op.Grads)
	}
	if op.Kind == Pull && op.Outcome == OK {
		s += fmt.Sprintf(" -> %v", op.Values)
	}
	s += fmt.Sprintf(" [%d,%d] %s", op.Call, op.Return, op.Outcome)
	if op.Level != "" {
		s += " " + op.Level
	}
	return s
}

func cloneOp(op Op) Op {
	op.Keys = append([]uint64(nil), op.Keys...)
	op.Grads = append([]int64(nil), op.Grads...)
	op.Values = append([]int64(nil), op.Values...)
	return op
}

// Validate reports the first operation that the checkers cannot interpret.
// Every checker calls it, so a malformed history is an error rather than a
// wrong verdict.
func Validate(ops []Op) error {
	for i := range ops {
		op := &ops[i]
		if err := validateOp(op); err != nil {
			return fmt.Errorf("history: op %d (%v): %w", i, *op, err)
		}
	}
	return nil
}

func validateOp(op *Op) error {
	if op.Outcome > Failed {
		return fmt.Errorf("invalid outcome %d", uint8(op.Outcome))
	}
	if op.Return < -1 || (op.Return >= 0 && op.Return < op.Call) {
		return fmt.Errorf("return %d before call %d", op.Return, op.Call)
	}
	if op.Outcome != Unknown && op.Return < 0 {
		return fmt.Errorf("outcome %s without a return time", op.Outcome)
	}
	switch op.Kind {
	case Push:
		if len(op.Grads) != len(op.Keys) {
			return fmt.Errorf("%d grads for %d keys", len(op.Grads), len(op.Keys))
		}
		for j, g := range op.Grads {
			// Positivity is what makes a row's value monotone in the set of
			// applied pushes; the bounded and final checks depend on it.
			if g <= 0 {
				return fmt.Errorf("non-positive gradient %d for key %d", g, op.Keys[j])
			}
		}
		if len(op.Values) != 0 {
			return fmt.Errorf("push with values")
		}
	case Pull:
		if len(op.Grads) != 0 {
			return fmt.Errorf("pull with grads")
		}
		if op.Outcome == OK && len(op.Values) != len(op.Keys) {
			return fmt.Errorf("%d values for %d keys", len(op.Values), len(op.Keys))
		}
	default:
		return fmt.Errorf("invalid kind %d", uint8(op.Kind))
	}
	return nil
}

// Recorder accumulates a history. It is safe for concurrent use.
type Recorder struct {
	start time.Time

	mu  sync.Mutex
	ops []Op
}

// NewRecorder starts the recorder's clock; all times are relative to it.
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now()}
}

// Pending is an invoked operation waiting for its outcome. Complete it
// exactly once with OK or Fail; one never completed stays Unknown, which is
// the honest record of a client that vanished mid-call.
type Pending struct {
	r   *Recorder
	idx int
}

// Invoke records the call of an operation now. The slices are copied, so the
// caller may reuse them. grads must be nil for a pull.
func (r *Recorder) Invoke(client int, kind Kind, keys []uint64, grads []int64) *Pending {
	return r.InvokeLevel(client, kind, "", keys, grads)
}

// InvokeLevel is Invoke with the consistency level the operation requested,
// kept so a failing history says what was asked for.
func (r *Recorder) InvokeLevel(client int, kind Kind, level string, keys []uint64, grads []int64) *Pending {
	op := Op{
		Client: client,
		Kind:   kind,
		Keys:   append([]uint64(nil), keys...),
		Grads:  append([]int64(nil), grads...),
		Return: -1,
		Level:  level,
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Reading the clock under the lock keeps r.ops sorted by Call, so Ops
	// need not sort.
	op.Call = r.now()
	r.ops = append(r.ops, op)
	return &Pending{r: r, idx: len(r.ops) - 1}
}

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// At is t on the recorder's clock: nanoseconds since it started.
func (r *Recorder) At(t time.Time) int64 { return int64(t.Sub(r.start)) }

// ReadGap is the longest stretch of [from, to) (on the recorder's clock) in
// which no pull completed successfully: from the window's start to the
// first completion, between two, from the last to its end. It measures how
// long readers were without an answer, whatever the reason.
func ReadGap(ops []Op, from, to int64) time.Duration {
	var done []int64
	for _, op := range ops {
		if op.Kind == Pull && op.Outcome == OK && op.Return >= from && op.Return < to {
			done = append(done, op.Return)
		}
	}
	slices.Sort(done)
	gap, last := int64(0), from
	for _, t := range done {
		gap, last = max(gap, t-last), t
	}
	return time.Duration(max(gap, to-last))
}

// OK records a successful return now. values is what a pull observed (one
// per key, see Op.Values) and is copied; pass nil for a push. A values slice
// of the wrong length is recorded as given and rejected by the checkers,
// because it is a fact about the run, not a reason to crash it.
func (p *Pending) OK(values []int64) {
	p.complete(OK, append([]int64(nil), values...), "")
}

// Fail records a failed return now, with its error (nil if none). definite
// means the operation certainly had no effect; otherwise the outcome is
// Unknown.
func (p *Pending) Fail(definite bool, err error) {
	o := Unknown
	if definite {
		o = Failed
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	p.complete(o, nil, msg)
}

func (p *Pending) complete(o Outcome, values []int64, errMsg string) {
	r := p.r
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[p.idx]
	if op.Return >= 0 {
		// Completing twice is a harness bug that would silently rewrite
		// history; refuse loudly.
		panic(fmt.Sprintf("history: operation %v completed twice", *op))
	}
	op.Return = r.now()
	op.Outcome, op.Error = o, errMsg
	if len(values) > 0 {
		op.Values = values
	}
}

// Ops returns a deep copy of the history so far, ordered by Call. Operations
// still in flight appear as Unknown with Return == -1.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Op, len(r.ops))
	for i, op := range r.ops {
		out[i] = cloneOp(op)
	}
	return out
}

// Counts is how a history's operations ended: pushes and pulls completed,
// and calls whose outcome is unknown.
type Counts struct{ Pushes, Pulls, Unknown int }

// Count tallies ops.
func Count(ops []Op) Counts {
	var c Counts
	for _, op := range ops {
		switch {
		case op.Outcome == Unknown:
			c.Unknown++
		case op.Outcome != OK:
		case op.Kind == Push:
			c.Pushes++
		default:
			c.Pulls++
		}
	}
	return c
}
