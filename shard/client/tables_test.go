package client

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
)

// TestAlterHotKeys: a hot-key setting given alone is paired with the
// table's other one (read only then), 0 turns hot keys off and drops the
// read replicas, and settings the server would refuse or drop are refused
// before anything is sent.
func TestAlterHotKeys(t *testing.T) {
	hot := TableSpec{Name: "t", HotThreshold: 500, HotReplicas: 3}
	off := TableSpec{Name: "t"}
	for _, tc := range []struct {
		name      string
		opts      []AlterOption
		cur       *TableSpec // nil: the spec must not be read
		threshold float64
		replicas  uint32
		err       string
	}{
		{name: "both", opts: []AlterOption{SetHotKeys(1000, 4)}, threshold: 1000, replicas: 4},
		{name: "threshold keeps replicas", opts: []AlterOption{SetHotThreshold(2000)}, cur: &hot, threshold: 2000, replicas: 3},
		{name: "replicas keep threshold", opts: []AlterOption{SetHotReplicas(5)}, cur: &hot, threshold: 500, replicas: 5},
		{name: "threshold on an off table", opts: []AlterOption{SetHotThreshold(2000)}, cur: &off, threshold: 2000},
		{name: "0 turns off", opts: []AlterOption{SetHotThreshold(0)}, threshold: 0, replicas: 0},
		{name: "replicas of an off table", opts: []AlterOption{SetHotReplicas(2)}, cur: &off, err: "hot keys are off"},
		{name: "replicas without threshold", opts: []AlterOption{SetHotKeys(0, 2)}, err: "without a threshold"},
		{name: "negative threshold", opts: []AlterOption{SetHotThreshold(-3)}, err: "want pulls a second >= 0"},
		{name: "NaN threshold", opts: []AlterOption{SetHotThreshold(math.NaN())}, cur: &hot, err: "want pulls a second >= 0"},
		{name: "too many replicas", opts: []AlterOption{SetHotReplicas(20)}, cur: &hot, err: "want 0..16"},
	} {
		var a alteration
		for _, o := range tc.opts {
			o(&a)
		}
		err := a.hotKeys(context.Background(), func(context.Context) (TableSpec, error) {
			if tc.cur == nil {
				t.Errorf("%s: the table's spec was read", tc.name)
				return TableSpec{}, errors.New("not expected")
			}
			return *tc.cur, nil
		})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrBadRequest) {
				t.Errorf("%s: error %v, want ErrBadRequest with %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !a.req.SetHot || a.req.HotThreshold != tc.threshold || a.req.HotReplicas != tc.replicas {
			t.Errorf("%s: request set=%v threshold=%v replicas=%d, want %v, %d", tc.name, a.req.SetHot, a.req.HotThreshold, a.req.HotReplicas, tc.threshold, tc.replicas)
		}
	}
}
