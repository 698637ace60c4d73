package store

import (
	"math"
	"testing"
)

func TestRoundBF16(t *testing.T) {
	for _, c := range []struct {
		in, want uint32 // float32 bits
	}{
		{0x3f800000, 0x3f800000}, // 1 is exact
		{0x3f808000, 0x3f800000}, // tie, even below: down
		{0x3f818000, 0x3f820000}, // tie, odd below: up
		{0x3f807fff, 0x3f800000}, // below the tie: down
		{0x3f808001, 0x3f810000}, // above the tie: up
		{0xbf808001, 0xbf810000}, // negative, same magnitude rule
		{0x3fffffff, 0x40000000}, // mantissa carry raises the exponent
		{0x7f7fffff, 0x7f800000}, // past the largest bfloat16: +Inf
		{0xff7fffff, 0xff800000}, // and -Inf
		{0x7f800000, 0x7f800000}, // +Inf stays
		{0x00000001, 0x00000000}, // the smallest subnormal rounds to 0
		{0x80000000, 0x80000000}, // -0 stays -0
	} {
		got := math.Float32bits(RoundBF16(math.Float32frombits(c.in)))
		if got != c.want {
			t.Errorf("RoundBF16(%#08x) = %#08x, want %#08x", c.in, got, c.want)
		}
		if !IsBF16(math.Float32frombits(got)) {
			t.Errorf("RoundBF16(%#08x) = %#08x is not a bfloat16", c.in, got)
		}
	}
	// Any NaN, even one whose payload lies only in the low bits that are
	// dropped, stays NaN: it must be refused, not become Inf.
	for _, nan := range []uint32{0x7f800001, 0xff800001, 0x7fc00000, 0x7f80ffff} {
		if got := RoundBF16(math.Float32frombits(nan)); !math.IsNaN(float64(got)) {
			t.Errorf("RoundBF16(NaN %#08x) = %v, want NaN", nan, got)
		}
	}
}

func TestBF16RoundTrip(t *testing.T) {
	v := []float32{0, -1.5, 3.14159, 1e-20, -6.5e30, float32(math.Inf(-1))}
	b := AppendBF16(nil, v)
	if len(b) != BF16Bytes*len(v) {
		t.Fatalf("encoded %d values into %d bytes", len(v), len(b))
	}
	got := make([]float32, len(v))
	WidenBF16(got, b)
	for i := range v {
		if want := RoundBF16(v[i]); math.Float32bits(got[i]) != math.Float32bits(want) {
			t.Errorf("value %d: %v → %v, want %v", i, v[i], got[i], want)
		}
		// Widening what was rounded loses nothing more.
		if again := RoundBF16(got[i]); math.Float32bits(again) != math.Float32bits(got[i]) {
			t.Errorf("value %d: rounding %v again gives %v", i, got[i], again)
		}
	}
	WidenBF16(nil, nil) // nothing to widen is not an error
	// Too few bytes is the caller's bug, caught, not read past.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("widening from too few bytes did not panic")
			}
		}()
		WidenBF16(got, b[:len(b)-1])
	}()
}
