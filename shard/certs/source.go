package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCheckEvery is how often, at most, a Source reads its files again
// to find renewed ones: on the first handshake after this long.
const DefaultCheckEvery = 10 * time.Second

// SourceOptions configure a Source.
type SourceOptions struct {
	// Want is what the own certificate must be: Kind alone (any node, any
	// client), or Kind and Name (this node). Zero accepts any identity, or
	// no certificate at all.
	Want Identity
	// CheckEvery is how often, at most, the files are read again
	// (0: DefaultCheckEvery; negative: only on Reload).
	CheckEvery time.Duration
	// OnReload, if set, is told of every change of the files: nil when the
	// new material was taken, else why it was not (the old material stays
	// in use). It is called from the handshake that noticed the change, so
	// it must not block.
	OnReload func(error)
	// OnRefused, if set, is told why a peer was refused at the handshake
	// (peer listener: not a node; dial: not the node dialed). Called from
	// handshakes: it must not block.
	OnRefused func(error)
}

// Source is one party's certificate material (the CAs it trusts, its own
// certificate and key), read from Files and read again when they change,
// so that renewed certificates and a rotated CA take effect on the next
// handshakes without a restart. Connections already open keep the
// certificates they were made with.
//
// A Source is safe for concurrent use: handshakes read the current
// material without locks; one of them at a time, at most every CheckEvery,
// reads the files again.
type Source struct {
	files   Files
	opts    SourceOptions
	cur     atomic.Pointer[material]
	checked atomic.Int64 // unix ns of the last look at the files
	mu      sync.Mutex   // serialises reloads; guards failed
	failed  [3][]byte    // the contents last refused, reported once
}

// material is one generation of a Source's files, parsed, with the TLS
// configurations built from it.
type material struct {
	raw     [3][]byte // CA, cert, key file contents
	pool    *x509.CertPool
	cert    *tls.Certificate // nil: no certificate of its own
	id      Identity
	clientL *tls.Config // client listener
	peerL   *tls.Config // peer listener
}

// NewSource reads the files and checks them: a CA file of CA certificates,
// and unless both Cert and Key are empty, a certificate signed by one of
// them, valid now, matching its key and carrying the identity opts.Want
// asks for.
func NewSource(files Files, opts SourceOptions) (*Source, error) {
	if opts.CheckEvery == 0 {
		opts.CheckEvery = DefaultCheckEvery
	}
	s := &Source{files: files, opts: opts}
	raw, err := s.read()
	if err != nil {
		return nil, err
	}
	m, err := s.parse(raw)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	s.checked.Store(time.Now().UnixNano())
	return s, nil
}

// Identity is the identity of the current certificate (zero without one).
func (s *Source) Identity() Identity { return s.cur.Load().id }

// NotAfter is when the current certificate expires (zero without one).
func (s *Source) NotAfter() time.Time {
	if c := s.cur.Load().cert; c != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// Reload reads the files now. On an error the material in use stays.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadLocked()
}

// material returns the current material, first reading the files again if
// CheckEvery has passed since the last look.
func (s *Source) material() *material {
	if s.opts.CheckEvery > 0 && time.Since(time.Unix(0, s.checked.Load())) >= s.opts.CheckEvery && s.mu.TryLock() {
		// Other handshakes meanwhile go on with the material they have.
		err := s.reloadLocked()
		s.mu.Unlock()
		if err != nil && s.opts.OnReload != nil && !errors.Is(err, errReported) {
			s.opts.OnReload(err)
		}
	}
	return s.cur.Load()
}

// errReported marks a refusal of contents already reported.
var errReported = errors.New("already reported")

func (s *Source) reloadLocked() error {
	s.checked.Store(time.Now().UnixNano())
	raw, err := s.read()
	if err != nil {
		return err
	}
	old := s.cur.Load()
	if sameFiles(raw, old.raw) {
		return nil
	}
	m, err := s.parse(raw)
	if err != nil {
		// A certificate and its key are renamed into place one after the
		// other: between the two the pair does not match. The next look
		// finds both; the error is reported once per contents.
		same := sameFiles(raw, s.failed)
		s.failed = raw
		if same {
			return fmt.Errorf("%w: %w", errReported, err)
		}
		return fmt.Errorf("renewed certificate files not used, the old ones stay in use: %w", err)
	}
	s.cur.Store(m)
	s.failed = [3][]byte{}
	if s.opts.OnReload != nil {
		s.opts.OnReload(nil)
	}
	return nil
}

func sameFiles(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

func (s *Source) read() ([3][]byte, error) {
	var raw [3][]byte
	var err error
	if raw[0], err = os.ReadFile(s.files.CA); err != nil {
		return raw, fmt.Errorf("%w: CA file: %v", ErrMaterial, err)
	}
	if s.files.Cert == "" && s.files.Key == "" {
		return raw, nil
	}
	if raw[1], err = os.ReadFile(s.files.Cert); err != nil {
		return raw, fmt.Errorf("%w: certificate: %v", ErrMaterial, err)
	}
	if raw[2], err = os.ReadFile(s.files.Key); err != nil {
		return raw, fmt.Errorf("%w: key: %v", ErrMaterial, err)
	}
	return raw, nil
}

func (s *Source) parse(raw [3][]byte) (*material, error) {
	cas, err := parseCertsPEM(raw[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.files.CA, err)
	}
	m := &material{raw: raw, pool: x509.NewCertPool()}
	for _, c := range cas {
		if !c.IsCA {
			return nil, fmt.Errorf("%w: %s: %q is not a CA certificate", ErrMaterial, s.files.CA, c.Subject.CommonName)
		}
		m.pool.AddCert(c)
	}
	if raw[1] != nil {
		kp, err := tls.X509KeyPair(raw[1], raw[2])
		if err != nil {
			return nil, fmt.Errorf("%w: %s and %s: %v", ErrMaterial, s.files.Cert, s.files.Key, err)
		}
		opts := x509.VerifyOptions{Roots: m.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
		if _, err := kp.Leaf.Verify(opts); err != nil {
			return nil, fmt.Errorf("%w: %s is not valid under %s now: %v", ErrMaterial, s.files.Cert, s.files.CA, err)
		}
		if m.id, err = IdentityOf(kp.Leaf); err != nil {
			return nil, fmt.Errorf("%s: %w", s.files.Cert, err)
		}
		m.cert = &kp
	}
	if w := s.opts.Want; w.Kind != 0 && (m.cert == nil || w.Kind != m.id.Kind || (w.Name != "" && w.Name != m.id.Name)) {
		got := "no certificate"
		if m.cert != nil {
			got = m.id.String()
		}
		want := "a " + w.Kind.String()
		if w.Name != "" {
			want = w.String()
		}
		return nil, fmt.Errorf("%w: %s is %s, want %s", ErrMaterial, s.files.Cert, got, want)
	}
	m.clientL, m.peerL = s.listenerConfigs(m)
	return m, nil
}

// RateLimited calls f at most once every interval; calls between are
// dropped. For OnRefused: a flood of handshakes must not flood the log.
func RateLimited(every time.Duration, f func(error)) func(error) {
	var last atomic.Int64
	return func(err error) {
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev >= int64(every) && last.CompareAndSwap(prev, now) {
			f(err)
		}
	}
}
