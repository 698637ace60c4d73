package history

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// LinResult is the verdict of CheckLinearizable.
type LinResult struct {
	// OK means every key's history was proven linearizable.
	OK bool
	// TimedOut means the check gave up before a verdict: neither OK nor a
	// proven violation. Callers usually treat it as a test failure, since a
	// history that porcupine cannot decide is too large or too concurrent.
	TimedOut bool
	Keys     int // distinct keys checked
	Ops      int // per-key operations checked (a push to 3 keys counts 3)
	// BadKey is the smallest key proven not linearizable; meaningful only
	// when len(BadKeys) > 0.
	BadKey uint64
	// BadKeys are the keys proven not linearizable, ascending. It can be
	// empty on a failure if localising the fault timed out.
	BadKeys []uint64
}

func (r LinResult) String() string {
	switch {
	case r.OK:
		return fmt.Sprintf("linearizable (%d keys, %d ops)", r.Keys, r.Ops)
	case r.TimedOut:
		return fmt.Sprintf("linearizability undecided: timed out (%d keys, %d ops)", r.Keys, r.Ops)
	case len(r.BadKeys) > 0:
		return fmt.Sprintf("NOT linearizable: keys %v (%d keys, %d ops)", r.BadKeys, r.Keys, r.Ops)
	}
	return fmt.Sprintf("NOT linearizable (%d keys, %d ops)", r.Keys, r.Ops)
}

// linKind distinguishes the per-key operations the model steps on.
type linKind uint8

const (
	linPush    linKind = iota // an acknowledged push
	linUnknown                // registration of a push of unknown outcome
	linPull
)

// linInput is one op restricted to one key.
type linInput struct {
	Key  uint64
	Kind linKind
	Grad int64
}

// linMeta ties a per-key operation back to the recorded op for the
// visualisation.
type linMeta struct {
	Index   int
	Outcome Outcome
	Level   string
}

// maxVisualizedKeys bounds the HTML file: past a few keys it is too large to
// load and the first failing key is what one debugs anyway.
const maxVisualizedKeys = 4

// linModel is a per-key model: the state is the sum of the gradients applied
// to the key, a push adds to it and a pull must observe its negation.
var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[uint64][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).Key
			byKey[k] = append(byKey[k], op)
		}
		return partitionsInKeyOrder(byKey)
	},
	PartitionEvent: func(history []porcupine.Event) [][]porcupine.Event {
		// A return event carries the output, not the input, so its key is
		// found through the call with the same Id.
		keyOf := map[int]uint64{}
		byKey := map[uint64][]porcupine.Event{}
		for _, ev := range history {
			if ev.Kind == porcupine.CallEvent {
				keyOf[ev.Id] = ev.Value.(linInput).Key
			}
			k := keyOf[ev.Id]
			byKey[k] = append(byKey[k], ev)
		}
		return partitionsInKeyOrder(byKey)
	},
	Init: func() interface{} { return linState{pending: [][]int64{nil}} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := state.(linState)
		in := input.(linInput)
		switch in.Kind {
		case linPush:
			return true, linState{sum: st.sum + in.Grad, pending: st.pending}
		case linUnknown:
			return true, st.register(in.Grad)
		}
		return st.observe(-output.(int64))
	},
	Equal: func(a, b interface{}) bool { return a.(linState).equal(b.(linState)) },
	Hash:  func(state interface{}) uint64 { return state.(linState).hash() },
	DescribeOperation: func(input, output interface{}) string {
		in := input.(linInput)
		switch in.Kind {
		case linPush:
			return fmt.Sprintf("push(%d, +%d)", in.Key, in.Grad)
		case linUnknown:
			return fmt.Sprintf("push(%d, +%d) unknown: pending from here", in.Key, in.Grad)
		}
		return fmt.Sprintf("pull(%d) -> %d", in.Key, output.(int64))
	},
	DescribeState: func(state interface{}) string { return state.(linState).String() },
	DescribeOperationMetadata: func(info interface{}) string {
		m, ok := info.(linMeta)
		if !ok {
			return ""
		}
		s := fmt.Sprintf("op #%d, %s", m.Index, m.Outcome)
		if m.Level != "" {
			s += ", " + m.Level
		}
		return s
	},
}

func partitionsInKeyOrder[T any](byKey map[uint64][]T) [][]T {
	keys := make([]uint64, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	out := make([][]T, len(keys))
	for i, k := range keys {
		out[i] = byKey[k]
	}
	return out
}

// CheckLinearizable checks, key by key, that ops are linearizable with
// respect to a table whose row value is minus the sum of applied gradients.
//
// Failed ops are dropped, and so are pulls that did not return OK since they
// observed nothing. A push with Outcome Unknown may take effect at any point
// after its call, or never. (The textbook encoding, an infinite return time,
// makes porcupine try every subset of the unknown pushes as distinct states
// and blows up past ~10 unknown pushes per key; see linState for the
// equivalent encoding used instead.)
//
// timeout bounds the search (0 means none); if it expires the result has
// TimedOut set. When the history is not linearizable, up to one further
// timeout is spent finding the failing keys and, if htmlPath is not empty,
// porcupine's visualisation of the first few of them is written there.
// Nothing is written when the check passes or times out, nor when the
// localisation times out (BadKeys empty). The error reports
// an invalid history or a failure to write the visualisation.
func CheckLinearizable(ops []Op, timeout time.Duration, htmlPath string) (LinResult, error) {
	if err := Validate(ops); err != nil {
		return LinResult{}, err
	}
	byKey := linOperations(ops)
	var res LinResult
	var all []porcupine.Operation
	for _, kops := range byKey {
		res.Keys++
		res.Ops += len(kops)
		all = append(all, kops...)
	}
	switch porcupine.CheckOperationsTimeout(linModel, all, timeout) {
	case porcupine.Ok:
		res.OK = true
		return res, nil
	case porcupine.Unknown:
		res.TimedOut = true
		return res, nil
	}

	// porcupine stops at the first illegal partition without saying which,
	// so localise the failure by checking keys one by one. Keys are
	// independent, so this finds every bad key, not only the first.
	res.BadKeys = badKeys(byKey, timeout)
	if len(res.BadKeys) == 0 {
		return res, nil
	}
	res.BadKey = res.BadKeys[0]
	if htmlPath == "" {
		return res, nil
	}
	var bad []porcupine.Operation
	for _, k := range res.BadKeys[:min(len(res.BadKeys), maxVisualizedKeys)] {
		bad = append(bad, byKey[k]...)
	}
	if err := visualize(bad, timeout, htmlPath); err != nil {
		return res, err
	}
	return res, nil
}

// linOperations splits every relevant op into one porcupine operation per
// key.
func linOperations(ops []Op) map[uint64][]porcupine.Operation {
	byKey := map[uint64][]porcupine.Operation{}
	for i := range ops {
		op := &ops[i]
		if op.Outcome == Failed || (op.Kind == Pull && op.Outcome != OK) {
			continue
		}
		ret := op.Return
		kind := linPull
		if op.Kind == Push {
			kind = linPush
			if op.Outcome == Unknown {
				// See linState: the push is registered at its call and
				// may be applied at any later point, or never.
				kind, ret = linUnknown, op.Call
			}
		}
		meta := linMeta{Index: i, Outcome: op.Outcome, Level: op.Level}
		for j, k := range op.Keys {
			in := linInput{Key: k, Kind: kind}
			var out interface{}
			if kind == linPull {
				out = op.Values[j]
			} else {
				in.Grad = op.Grads[j]
			}
			byKey[k] = append(byKey[k], porcupine.Operation{
				// The visualisation requires non-negative client ids.
				ClientId: max(op.Client, 0),
				Input:    in,
				Call:     op.Call,
				Output:   out,
				Return:   ret,
				Metadata: meta,
			})
		}
	}
	return byKey
}

// badKeys checks each key on its own, in parallel, and returns the keys
// proven not linearizable within timeout, ascending.
func badKeys(byKey map[uint64][]porcupine.Operation, timeout time.Duration) []uint64 {
	keys := make(chan uint64)
	var (
		mu  sync.Mutex
		bad []uint64
		wg  sync.WaitGroup
	)
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for k := range keys {
				left := time.Duration(0)
				if !deadline.IsZero() {
					if left = time.Until(deadline); left <= 0 {
						continue // drain so the producer never blocks
					}
				}
				if porcupine.CheckOperationsTimeout(linModel, byKey[k], left) == porcupine.Illegal {
					mu.Lock()
					bad = append(bad, k)
					mu.Unlock()
				}
			}
		})
	}
	for k := range byKey {
		keys <- k
	}
	close(keys)
	wg.Wait()
	sort.Slice(bad, func(i, j int) bool { return bad[i] < bad[j] })
	return bad
}

func visualize(history []porcupine.Operation, timeout time.Duration, path string) (err error) {
	_, info := porcupine.CheckOperationsVerbose(linModel, history, timeout)
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("history: write visualisation: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("history: write visualisation %s: %w", path, cerr)
		}
	}()
	if err := porcupine.Visualize(linModel, info, f); err != nil {
		return fmt.Errorf("history: write visualisation %s: %w", path, err)
	}
	return nil
}
