package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFile writes ops as JSON lines, one op per line, so a history can be
// read with grep and diffed. The file is written under a temporary name and
// renamed, so a crash never leaves a truncated history that looks complete.
func WriteFile(path string, ops []Op) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("history: write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range ops {
		if err := enc.Encode(&ops[i]); err != nil {
			return fmt.Errorf("history: write %s: op %d: %w", path, i, err)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("history: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("history: write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("history: write %s: %w", path, err)
	}
	return nil
}

// ReadFile reads a history written by WriteFile. It does not validate the
// ops; the checkers do.
func ReadFile(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: read %s: %w", path, err)
	}
	defer f.Close()
	// A decoder rather than a line scanner: a pull of many keys can exceed
	// any fixed line limit.
	dec := json.NewDecoder(bufio.NewReader(f))
	var ops []Op
	for {
		var op Op
		err := dec.Decode(&op)
		if errors.Is(err, io.EOF) {
			return ops, nil
		}
		if err != nil {
			return nil, fmt.Errorf("history: read %s: op %d: %w", path, len(ops), err)
		}
		ops = append(ops, op)
	}
}
