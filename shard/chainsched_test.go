package shard

import (
	"slices"
	"strings"
	"testing"
)

func TestChainStep(t *testing.T) {
	set := func(s string) func(string) bool {
		return func(id string) bool { return strings.Contains(" "+s+" ", " "+id+" ") }
	}
	none := set("")
	all := func(string) bool { return true }
	l := func(s string) []string { return strings.Fields(s) }
	cases := []struct {
		name          string
		order, target string
		dead, canAdd  func(string) bool
		want          string // "" = no step
	}{
		{"settled", "a b c", "a b c", none, all, ""},
		{"target order ignored", "a b c", "c a b", none, all, ""},
		{"dead head removed, order kept", "a b c", "a b c", set("a"), all, "b c"},
		{"dead middle removed", "a b c", "a b c", set("b"), all, "a c"},
		{"dead tail removed", "a b c", "a b c", set("c"), all, "a b"},
		{"two dead: one per epoch, head first", "a b c", "a b c", set("a c"), all, "b c"},
		{"all dead: wait", "a b c", "a b c", set("a b c"), all, ""},
		{"replacement appended at the tail", "b c", "d b c", none, all, "b c d"},
		{"restarted node appended at the tail", "b c", "a b c", none, all, "b c a"},
		{"no replacement that may join", "b c", "a b c", none, none, ""},
		{"rebalance: append first", "a b c", "a b d", none, all, "a b c d"},
		{"rebalance: then remove the old", "a b c d", "a b d", none, all, "a b d"},
		{"dead before surplus", "a b c d", "a b d", set("d"), all, "a b c"},
		{"dead node not re-added", "b c", "a b c", set("a"), func(id string) bool { return id != "a" }, ""},
	}
	for _, c := range cases {
		got := chainStep(l(c.order), l(c.target), c.dead, c.canAdd)
		if !slices.Equal(got, l(c.want)) {
			t.Errorf("%s: chainStep(%q → %q) = %q, want %q", c.name, c.order, c.target, got, c.want)
		}
	}
}

// TestChainStepKeepsPrefixOrder drives chainStep to a fixed point from many
// orders and targets and checks every step is a removal that keeps the
// survivors' relative order or an append at the tail: the rule the chain
// core's prefix invariant rests on.
func TestChainStepKeepsPrefixOrder(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	perms := func(n int) [][]string {
		var out [][]string
		var rec func(cur []string)
		rec = func(cur []string) {
			if len(cur) == n {
				out = append(out, slices.Clone(cur))
				return
			}
			for _, x := range nodes {
				if !slices.Contains(cur, x) {
					rec(append(cur, x))
				}
			}
		}
		rec(nil)
		return out
	}
	for _, order := range perms(3) {
		for _, target := range perms(3)[:20] {
			for deadMask := range 8 {
				dead := func(id string) bool {
					i := slices.Index(nodes, id)
					return i < 3 && deadMask&(1<<i) != 0
				}
				canAdd := func(id string) bool { return !dead(id) }
				cur := order
				for step := 0; ; step++ {
					next := chainStep(cur, target, dead, canAdd)
					if next == nil {
						break
					}
					if step > 10 {
						t.Fatalf("order %v target %v dead %b: no fixed point (at %v)", order, target, deadMask, cur)
					}
					switch {
					case len(next) == len(cur)+1:
						if !slices.Equal(next[:len(cur)], cur) {
							t.Fatalf("%v → %v: an add not at the tail", cur, next)
						}
					case len(next) == len(cur)-1:
						kept := slices.DeleteFunc(slices.Clone(cur), func(id string) bool { return !slices.Contains(next, id) })
						if !slices.Equal(kept, next) {
							t.Fatalf("%v → %v: a removal that reorders", cur, next)
						}
						if len(next) == 0 {
							t.Fatalf("%v → %v: removed the last member", cur, next)
						}
					default:
						t.Fatalf("%v → %v: not one add or one removal", cur, next)
					}
					cur = next
				}
			}
		}
	}
}
