package trainer

import "fmt"

// Keys are global uint64s: the top KeyFieldBits bits hold the field (0..255),
// the low 56 bits an id within the field, so two fields never share a key.
const (
	KeyFieldBits  = 8
	keyFieldShift = 64 - KeyFieldBits
	// MaxFields is the number of distinct fields a key can name.
	MaxFields = 1 << KeyFieldBits
	// KeyIDMask selects the id bits of a key.
	KeyIDMask = 1<<keyFieldShift - 1
)

// MakeKey returns the key of id in field. It panics if field is outside
// [0, MaxFields); id is truncated to its low 56 bits.
func MakeKey(field int, id uint64) uint64 {
	if field < 0 || field >= MaxFields {
		panic(fmt.Sprintf("trainer: field %d outside [0, %d)", field, MaxFields))
	}
	return uint64(field)<<keyFieldShift | id&KeyIDMask
}

// KeyField returns the field of a key.
func KeyField(k uint64) int { return int(k >> keyFieldShift) }

// KeyID returns the id of a key within its field.
func KeyID(k uint64) uint64 { return k & KeyIDMask }

// Sample is one labelled example.
type Sample struct {
	// Label is 0 or 1.
	Label float32
	// Keys are the sparse features, each a key made by MakeKey. A key may
	// repeat; a field may have no key (an empty bag) or several.
	Keys []uint64
	// Vals are the values of Keys, parallel to it; nil means every value is 1.
	Vals []float32
	// Dense are the dense features; nil when there are none.
	Dense []float32
	// Prob is the true probability of a positive label when it is known (the
	// synthetic generator's planted model) and NaN otherwise (readers).
	Prob float64
}

// Val returns the value of s.Keys[j].
func (s *Sample) Val(j int) float32 {
	if s.Vals == nil {
		return 1
	}
	return s.Vals[j]
}

// Batch is a mini-batch with its keys deduplicated. Rows pulled from the
// parameter server and row gradients pushed back are laid out in the order of
// Keys: row u is rows[u*dim : (u+1)*dim].
type Batch struct {
	Samples []Sample
	// Keys are the distinct keys of the batch in order of first appearance
	// (samples in order, keys in order within a sample).
	Keys []uint64
	// Index maps every key occurrence to its row: the j-th key of sample i is
	// Keys[Index[Offsets[i]+j]].
	Index []int32
	// Offsets has len(Samples)+1 entries; sample i's occurrences are
	// Index[Offsets[i]:Offsets[i+1]].
	Offsets []int32
}

// NewBatch deduplicates the keys of samples. It keeps samples (not a copy).
func NewBatch(samples []Sample) *Batch {
	n := 0
	for i := range samples {
		n += len(samples[i].Keys)
	}
	b := &Batch{
		Samples: samples,
		Index:   make([]int32, 0, n),
		Offsets: make([]int32, 1, len(samples)+1),
	}
	pos := make(map[uint64]int32, n)
	for i := range samples {
		for _, k := range samples[i].Keys {
			u, ok := pos[k]
			if !ok {
				u = int32(len(b.Keys))
				pos[k] = u
				b.Keys = append(b.Keys, k)
			}
			b.Index = append(b.Index, u)
		}
		b.Offsets = append(b.Offsets, int32(len(b.Index)))
	}
	return b
}

// Labels returns the labels of the batch's samples.
func (b *Batch) Labels() []float32 {
	out := make([]float32, len(b.Samples))
	for i := range b.Samples {
		out[i] = b.Samples[i].Label
	}
	return out
}
