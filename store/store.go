package store

import (
	"fmt"
	"slices"
	"sync"
)

// Store is a set of tables by name, for a process that serves several. It only
// routes: each Table does its own locking.
type Store struct {
	mu     sync.RWMutex // guards tables
	tables map[string]*Table
}

// New returns an empty Store.
func New() *Store { return &Store{tables: make(map[string]*Table)} }

// CreateTable adds an empty table.
func (s *Store) CreateTable(cfg TableConfig) (*Table, error) {
	t, err := NewTable(cfg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tables[cfg.Name]; ok {
		return nil, fmt.Errorf("table %q: %w", cfg.Name, ErrTableExists)
	}
	s.tables[cfg.Name] = t
	return t, nil
}

// DropTable removes a table. Holders of the *Table may go on using it.
func (s *Store) DropTable(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tables[name]; !ok {
		return fmt.Errorf("table %q: %w", name, ErrUnknownTable)
	}
	delete(s.tables, name)
	return nil
}

// Table returns the named table.
func (s *Store) Table(name string) (*Table, error) {
	s.mu.RLock()
	t, ok := s.tables[name]
	s.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("table %q: %w", name, ErrUnknownTable)
	}
	return t, nil
}

// Tables returns the table names, sorted.
func (s *Store) Tables() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.tables))
	for n := range s.tables {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Apply is Table.Apply on the named table.
func (s *Store) Apply(table string, keys []uint64, grads []float32) error {
	t, err := s.Table(table)
	if err != nil {
		return err
	}
	return t.Apply(keys, grads)
}

// Lookup is Table.Lookup on the named table.
func (s *Store) Lookup(table string, keys []uint64, out []float32) error {
	t, err := s.Table(table)
	if err != nil {
		return err
	}
	return t.Lookup(keys, out)
}

// MemoryBytes returns the bytes held by every table.
func (s *Store) MemoryBytes() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var b int64
	for _, t := range s.tables {
		b += t.MemoryBytes()
	}
	return b
}
