package shard

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// ShardOf returns the shard of key in a table of n shards. It is part of the
// wire contract: clients and servers must agree on it, so it never changes.
// The key is mixed first so that sequential IDs spread evenly.
func ShardOf(key uint64, n uint32) uint32 {
	return uint32(fmix64(key) % uint64(n))
}

// The wire carries keys and values as packed little-endian bytes. On the
// little-endian machines raftps runs on (checked in init) that is their memory,
// so packing and unpacking are single copies.

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

func growTo[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
