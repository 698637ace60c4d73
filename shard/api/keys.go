package api

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/raftps/raftps/store"
)

// ShardOf returns the shard of key in a table of n shards. It is part of the
// wire contract: clients and servers must agree on it, so it never changes.
// The key is mixed first so that sequential IDs spread evenly.
func ShardOf(key uint64, n uint32) uint32 {
	return uint32(Mix64(key) % uint64(n))
}

// Mix64 is MurmurHash3's finalizer, a bijection that mixes every bit.
func Mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// GroupID names a shard's replication group: "table/shard". It is also the
// group's directory under a node's data dir, and how peers address it.
func GroupID(table string, shard uint32) string { return fmt.Sprintf("%s/%d", table, shard) }

// MetaGroupID is the Raft group of the cluster's metadata.
const MetaGroupID = "meta"

// The wire carries keys and values as packed little-endian bytes. On the
// little-endian machines raftps runs on (checked in init) that is their
// memory, so packing and unpacking are single copies.

func init() {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		panic("raftps: big-endian platforms are not supported")
	}
}

// KeysBytes views keys as their wire bytes (no copy).
func KeysBytes(keys []uint64) []byte {
	if len(keys) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&keys[0])), len(keys)*8)
}

// ValuesBytes views values as their wire bytes (no copy).
func ValuesBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4)
}

// FloatsOf views b, whose length is a multiple of 4 and whose start is
// 4-byte aligned (any Go allocation of 4 bytes or more is), as float32
// values (no copy): ValuesBytes' inverse.
func FloatsOf(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// DecodeKeys copies wire bytes into keys, growing it as needed.
func DecodeKeys(b []byte, keys []uint64) ([]uint64, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("%w: keys field is %d bytes, not a multiple of 8", ErrBadRequest, len(b))
	}
	keys = growTo(keys, len(b)/8)
	copy(KeysBytes(keys), b)
	return keys, nil
}

// DecodeValues copies wire bytes into v, growing it as needed.
func DecodeValues(b []byte, v []float32) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("%w: values field is %d bytes, not a multiple of 4", ErrBadRequest, len(b))
	}
	v = growTo(v, len(b)/4)
	copy(ValuesBytes(v), b)
	return v, nil
}

// DecodeGrads decodes a push's gradients for a table of the given
// precision: float32 bytes, or bfloat16 bytes when bf16 is set (widened
// exactly). A float32 push to a bfloat16 table is rounded here, so what
// enters the log, and every replica's rows, is the same whichever client
// sent it.
func DecodeGrads(b []byte, bf16, tableBF16 bool) ([]float32, error) {
	if !bf16 {
		v, err := DecodeValues(b, nil)
		if err == nil && tableBF16 {
			store.RoundAllBF16(v)
		}
		return v, err
	}
	if !tableBF16 {
		return nil, fmt.Errorf("%w: bfloat16 gradients for a table of float32 gradients", ErrBadRequest)
	}
	if len(b)%store.BF16Bytes != 0 {
		return nil, fmt.Errorf("%w: bfloat16 grads field is %d bytes, not a multiple of 2", ErrBadRequest, len(b))
	}
	v := make([]float32, len(b)/store.BF16Bytes)
	store.WidenBF16(v, b)
	return v, nil
}

func growTo[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
