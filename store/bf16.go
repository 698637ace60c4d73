package store

import (
	"encoding/binary"
	"fmt"
	"math"
)

// bfloat16 gradients.
//
// A table may take its gradients as bfloat16: the high 16 bits of a
// float32 (sign, the same 8-bit exponent, 7 bits of mantissa). Half the
// bytes cross the network, the Raft log and its fsyncs, and every replica
// widens them back to float32 before the optimizer runs, so rows and
// optimizer state stay float32. Widening is exact and rounding is integer
// arithmetic on the bits, so every replica, on any CPU, applies the same
// float32 values: the rounding happens once, before the push enters the
// log (in the client, or in the node that accepts a float32 push).

// BF16Bytes is the size of one bfloat16 value.
const BF16Bytes = 2

// RoundBF16 returns the float32 nearest to x that bfloat16 can hold,
// rounding ties to even, as hardware converters do. NaN stays NaN (quiet)
// and ±Inf stays; a finite x beyond bfloat16's largest value rounds to
// ±Inf, which Apply then refuses like any infinite gradient.
func RoundBF16(x float32) float32 {
	return math.Float32frombits(uint32(bf16Bits(x)) << 16)
}

// bf16Bits is x rounded to bfloat16 (see RoundBF16), as its 16 bits.
func bf16Bits(x float32) uint16 {
	b := math.Float32bits(x)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it NaN, whatever its payload
		return uint16(b>>16) | 0x0040
	}
	// Round to nearest, ties to even: add 0x7fff plus the lowest bit that
	// stays. A carry out of the mantissa raises the exponent, which is the
	// right answer (and reaches Inf past the largest finite value).
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// AppendBF16 appends each value of v rounded to bfloat16, little-endian,
// two bytes each.
func AppendBF16(dst []byte, v []float32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint16(dst, bf16Bits(x))
	}
	return dst
}

// WidenBF16 writes into dst the float32 value of each little-endian
// bfloat16 in src. src must hold 2 × len(dst) bytes (its callers have
// checked the message's length already); a shorter one panics.
func WidenBF16(dst []float32, src []byte) {
	if len(src) < BF16Bytes*len(dst) {
		// Reslicing would look at capacity, not length: say it plainly.
		panic(fmt.Sprintf("store.WidenBF16: %d bytes for %d values", len(src), len(dst)))
	}
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// RoundAllBF16 rounds every value of v to bfloat16 in place (RoundBF16).
func RoundAllBF16(v []float32) {
	for i, x := range v {
		v[i] = RoundBF16(x)
	}
}

// IsBF16 reports whether x is a value bfloat16 holds exactly (its low 16
// bits are zero): what every gradient of a bfloat16 push must be.
func IsBF16(x float32) bool { return math.Float32bits(x)&0xffff == 0 }
