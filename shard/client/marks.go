package client

import (
	"sync"
	"time"
)

// marks is a set of node addresses, each marked for a while: the silent
// nodes (asked last for silentFor) and the slow ones a hedge beat (for
// slowFor). Safe for concurrent use; the zero value is empty.
type marks struct {
	mu  sync.Mutex
	at  map[string]time.Time // by when each was marked
	ttl time.Duration
}

func (m *marks) mark(addr string) {
	m.mu.Lock()
	if m.at == nil {
		m.at = map[string]time.Time{}
	}
	m.at[addr] = time.Now()
	m.mu.Unlock()
}

func (m *marks) unmark(addr string) {
	m.mu.Lock()
	delete(m.at, addr)
	m.mu.Unlock()
}

// markedFor reports whether addr is marked, and was at least d ago.
func (m *marks) markedFor(addr string, d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.at[addr]
	return ok && time.Since(t) < m.ttl && time.Since(t) >= d
}

// has reports whether addr was marked less than ttl ago, forgetting an
// older mark.
func (m *marks) has(addr string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.at[addr]
	if ok && time.Since(t) >= m.ttl {
		delete(m.at, addr)
		return false
	}
	return ok
}
