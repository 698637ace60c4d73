//go:build !amd64

package collective

// addInto sets dst[i] = src[i] + dst[i] (the operand order matters only for
// NaN payloads, but it is fixed).
func addInto(dst, src []float32) { addIntoGo(dst, src) }
