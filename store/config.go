package store

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Limits on a table config.
const (
	MaxDim        = 4096
	MaxNameLength = 128
)

// InitKind names an initializer.
type InitKind uint8

const (
	InitZeros InitKind = iota
	InitUniform
	InitNormal
)

func (k InitKind) String() string {
	switch k {
	case InitZeros:
		return "zeros"
	case InitUniform:
		return "uniform"
	case InitNormal:
		return "normal"
	}
	return fmt.Sprintf("InitKind(%d)", uint8(k))
}

// Initializer gives the first value of every column of a row that has never
// been pushed. Scale is a for uniform (values in [-a, a)) and sigma for normal.
type Initializer struct {
	Kind  InitKind
	Scale float32
}

// String returns the form ParseInitializer reads: "zeros", "uniform:0.01", "normal:0.1".
func (in Initializer) String() string {
	if in.Kind == InitZeros {
		return "zeros"
	}
	return in.Kind.String() + ":" + fmtF32(in.Scale)
}

// ParseInitializer reads "zeros", "uniform:A" or "normal:SIGMA".
func ParseInitializer(s string) (Initializer, error) {
	kind, arg, hasArg := strings.Cut(strings.TrimSpace(s), ":")
	var in Initializer
	switch kind {
	case "zeros", "zero":
		if hasArg {
			return in, fmt.Errorf("%w: initializer %q: zeros takes no argument", ErrInvalidConfig, s)
		}
		return Initializer{Kind: InitZeros}, nil
	case "uniform":
		in.Kind = InitUniform
	case "normal":
		in.Kind = InitNormal
	default:
		return in, fmt.Errorf("%w: initializer %q: want zeros, uniform:A or normal:SIGMA", ErrInvalidConfig, s)
	}
	if !hasArg {
		return in, fmt.Errorf("%w: initializer %q: %s needs a scale, e.g. %s:0.01", ErrInvalidConfig, s, kind, kind)
	}
	v, err := parseF32(arg)
	if err != nil {
		return in, fmt.Errorf("%w: initializer %q: scale %q is not a number", ErrInvalidConfig, s, arg)
	}
	in.Scale = v
	return in, in.validate()
}

func (in Initializer) validate() error {
	switch in.Kind {
	case InitZeros:
		return nil
	case InitUniform, InitNormal:
		if !(in.Scale > 0) || math.IsInf(float64(in.Scale), 0) {
			return fmt.Errorf("%w: initializer %s: scale = %v (want a finite value > 0)", ErrInvalidConfig, in.Kind, in.Scale)
		}
		return nil
	}
	return fmt.Errorf("%w: initializer kind = %d (want zeros, uniform or normal)", ErrInvalidConfig, uint8(in.Kind))
}

// OptKind names an optimizer.
type OptKind uint8

const (
	SGD OptKind = iota
	Adagrad
	Adam
	FTRL
	// Assign sets the row to the pushed vector: w = g. It is for values
	// that are not gradients, such as checkpoints of a trainer's dense
	// parameters or training clocks. Duplicate keys in one push are summed
	// before they are assigned, as for every optimizer.
	Assign
)

func (k OptKind) String() string {
	switch k {
	case SGD:
		return "sgd"
	case Adagrad:
		return "adagrad"
	case Adam:
		return "adam"
	case FTRL:
		return "ftrl"
	case Assign:
		return "assign"
	}
	return fmt.Sprintf("OptKind(%d)", uint8(k))
}

// stateSlots is how many float32 vectors of length dim the optimizer keeps per
// row beside the row's values.
func (k OptKind) stateSlots() int {
	switch k {
	case Adagrad:
		return 1 // accumulator
	case Adam, FTRL:
		return 2 // m, v  /  z, n
	}
	return 0
}

// Optimizer is an optimizer with its hyper-parameters. Fields an optimizer does
// not use must be zero. Start from DefaultOptimizer and change what you need;
// the update rules are written out in optim.go.
type Optimizer struct {
	Kind OptKind
	// LR is the learning rate (FTRL: alpha).
	LR float32
	// Eps is added to the denominator (Adagrad, Adam).
	Eps float32
	// InitAcc is the Adagrad accumulator's first value.
	InitAcc float32
	// Beta1 and Beta2 are Adam's moment decay rates.
	Beta1, Beta2 float32
	// Beta, L1 and L2 are FTRL-Proximal's smoothing and regularisation terms.
	Beta, L1, L2 float32
}

// DefaultOptimizer returns kind with the usual hyper-parameters.
func DefaultOptimizer(kind OptKind) Optimizer {
	switch kind {
	case Adagrad:
		return Optimizer{Kind: Adagrad, LR: 0.01, InitAcc: 0.1, Eps: 1e-7}
	case Adam:
		return Optimizer{Kind: Adam, LR: 0.001, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
	case FTRL:
		return Optimizer{Kind: FTRL, LR: 0.05, Beta: 1}
	case Assign:
		return Optimizer{Kind: Assign}
	}
	return Optimizer{Kind: SGD, LR: 0.01}
}

// optParam describes one hyper-parameter for parsing, printing and validation.
type optParam struct {
	name  string
	field func(*Optimizer) *float32
	min   float32 // smallest allowed value
	minOK bool    // whether min itself is allowed
	below float32 // exclusive upper bound; 0 means none
}

var (
	pLR      = optParam{"lr", func(o *Optimizer) *float32 { return &o.LR }, 0, false, 0}
	pEps     = optParam{"eps", func(o *Optimizer) *float32 { return &o.Eps }, 0, false, 0}
	pInitAcc = optParam{"init_acc", func(o *Optimizer) *float32 { return &o.InitAcc }, 0, true, 0}
	pBeta1   = optParam{"beta1", func(o *Optimizer) *float32 { return &o.Beta1 }, 0, true, 1}
	pBeta2   = optParam{"beta2", func(o *Optimizer) *float32 { return &o.Beta2 }, 0, true, 1}
	pBeta    = optParam{"beta", func(o *Optimizer) *float32 { return &o.Beta }, 0, true, 0}
	pL1      = optParam{"l1", func(o *Optimizer) *float32 { return &o.L1 }, 0, true, 0}
	pL2      = optParam{"l2", func(o *Optimizer) *float32 { return &o.L2 }, 0, true, 0}
	allOpt   = []optParam{pLR, pEps, pInitAcc, pBeta1, pBeta2, pBeta, pL1, pL2}
)

func (k OptKind) params() []optParam {
	switch k {
	case SGD:
		return []optParam{pLR}
	case Adagrad:
		return []optParam{pLR, pInitAcc, pEps}
	case Adam:
		return []optParam{pLR, pBeta1, pBeta2, pEps}
	case FTRL:
		return []optParam{pLR, pBeta, pL1, pL2}
	case Assign:
		return []optParam{}
	}
	return nil
}

// String returns the form ParseOptimizer reads, with every parameter spelled out,
// e.g. "adagrad:lr=0.01,init_acc=0.1,eps=1e-07".
func (o Optimizer) String() string {
	var b strings.Builder
	b.WriteString(o.Kind.String())
	for i, p := range o.Kind.params() {
		if i == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(p.name)
		b.WriteByte('=')
		b.WriteString(fmtF32(*p.field(&o)))
	}
	return b.String()
}

// ParseOptimizer reads "KIND" or "KIND:name=value,...", starting from
// DefaultOptimizer(KIND). KIND is sgd, adagrad, adam, ftrl or assign; the names are
// those String prints.
func ParseOptimizer(s string) (Optimizer, error) {
	kindStr, args, _ := strings.Cut(strings.TrimSpace(s), ":")
	var kind OptKind
	switch kindStr {
	case "sgd":
		kind = SGD
	case "adagrad":
		kind = Adagrad
	case "adam":
		kind = Adam
	case "ftrl":
		kind = FTRL
	case "assign":
		kind = Assign
	default:
		return Optimizer{}, fmt.Errorf("%w: optimizer %q: want sgd, adagrad, adam, ftrl or assign", ErrInvalidConfig, kindStr)
	}
	o := DefaultOptimizer(kind)
	if args != "" {
		for _, kv := range strings.Split(args, ",") {
			name, val, ok := strings.Cut(kv, "=")
			name = strings.TrimSpace(name)
			if !ok {
				return o, fmt.Errorf("%w: optimizer %s: %q is not name=value", ErrInvalidConfig, kind, kv)
			}
			var p *optParam
			for _, q := range kind.params() {
				if q.name == name {
					p = &q
					break
				}
			}
			if p == nil {
				names := make([]string, 0, 4)
				for _, q := range kind.params() {
					names = append(names, q.name)
				}
				return o, fmt.Errorf("%w: optimizer %s has no parameter %q (it has %s)", ErrInvalidConfig, kind, name, strings.Join(names, ", "))
			}
			v, err := parseF32(val)
			if err != nil {
				return o, fmt.Errorf("%w: optimizer %s: %s = %q is not a number", ErrInvalidConfig, kind, name, val)
			}
			*p.field(&o) = v
		}
	}
	return o, o.validate()
}

func (o Optimizer) validate() error {
	params := o.Kind.params()
	if params == nil {
		return fmt.Errorf("%w: optimizer kind = %d (want sgd, adagrad, adam, ftrl or assign)", ErrInvalidConfig, uint8(o.Kind))
	}
	for _, p := range params {
		v := *p.field(&o)
		bad := math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < p.min || (!p.minOK && v == p.min) || (p.below != 0 && v >= p.below)
		if bad {
			want := ">= " + fmtF32(p.min)
			if !p.minOK {
				want = "> " + fmtF32(p.min)
			}
			if p.below != 0 {
				want = fmtF32(p.min) + " <= " + p.name + " < " + fmtF32(p.below)
			}
			return fmt.Errorf("%w: optimizer %s: %s = %v (want finite %s)", ErrInvalidConfig, o.Kind, p.name, v, want)
		}
	}
	// Parameters the optimizer does not use must be zero so that two configs that
	// behave the same also compare and serialise the same.
outer:
	for _, p := range allOpt {
		for _, q := range params {
			if q.name == p.name {
				continue outer
			}
		}
		if v := *p.field(&o); v != 0 {
			return fmt.Errorf("%w: optimizer %s: %s = %v is not a parameter of %s (leave it 0)", ErrInvalidConfig, o.Kind, p.name, v, o.Kind)
		}
	}
	return nil
}

// TableConfig is what a table is created with. It is immutable for the life of
// the table: every replica must interpret pushes identically.
type TableConfig struct {
	Name      string
	Dim       int
	Init      Initializer
	Optimizer Optimizer
	// Seed feeds the initializer; tables with equal seeds start with equal rows.
	Seed uint64
}

// Validate checks every field and names the first bad one with its value.
func (c TableConfig) Validate() error {
	if err := validateName(c.Name); err != nil {
		return err
	}
	if c.Dim < 1 || c.Dim > MaxDim {
		return fmt.Errorf("%w: table %q: dim = %d (want 1..%d)", ErrInvalidConfig, c.Name, c.Dim, MaxDim)
	}
	if err := c.Init.validate(); err != nil {
		return fmt.Errorf("table %q: %w", c.Name, err)
	}
	if err := c.Optimizer.validate(); err != nil {
		return fmt.Errorf("table %q: %w", c.Name, err)
	}
	return nil
}

func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: name is empty", ErrInvalidConfig)
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("%w: name %.20q... is %d bytes (want at most %d)", ErrInvalidConfig, name, len(name), MaxNameLength)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%w: name %q: byte %d (%q) is not a letter, digit, '_', '-' or '.'", ErrInvalidConfig, name, i, c)
		}
	}
	return nil
}

func (c TableConfig) String() string {
	return fmt.Sprintf("%s dim=%d init=%s optimizer=%s seed=%d", c.Name, c.Dim, c.Init, c.Optimizer, c.Seed)
}

// configWireVersion is the version of MarshalBinary's layout.
const configWireVersion = 1

// MarshalBinary encodes c exactly (floats by their bits), for snapshots and
// replicated table definitions.
func (c TableConfig) MarshalBinary() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 64+len(c.Name))
	b = append(b, configWireVersion)
	b = binary.AppendUvarint(b, uint64(len(c.Name)))
	b = append(b, c.Name...)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Dim))
	b = append(b, byte(c.Init.Kind))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(c.Init.Scale))
	b = append(b, byte(c.Optimizer.Kind))
	for _, p := range allOpt {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(*p.field(&c.Optimizer)))
	}
	b = binary.LittleEndian.AppendUint64(b, c.Seed)
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary wrote and validates it.
func (c *TableConfig) UnmarshalBinary(b []byte) error {
	bad := func(what string) error {
		return fmt.Errorf("%w: encoded config: %s", ErrInvalidConfig, what)
	}
	if len(b) < 1 || b[0] != configWireVersion {
		return bad("unknown version")
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > MaxNameLength || uint64(len(b)-k) < n {
		return bad("bad name length")
	}
	b = b[k:]
	var out TableConfig
	out.Name = string(b[:n])
	b = b[n:]
	const fixed = 4 + 1 + 4 + 1 + 4*8 + 8
	if len(b) != fixed {
		return bad(fmt.Sprintf("%d bytes after the name (want %d)", len(b), fixed))
	}
	out.Dim = int(binary.LittleEndian.Uint32(b))
	out.Init.Kind = InitKind(b[4])
	out.Init.Scale = math.Float32frombits(binary.LittleEndian.Uint32(b[5:]))
	out.Optimizer.Kind = OptKind(b[9])
	b = b[10:]
	for _, p := range allOpt {
		*p.field(&out.Optimizer) = math.Float32frombits(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	out.Seed = binary.LittleEndian.Uint64(b)
	if err := out.Validate(); err != nil {
		return err
	}
	*c = out
	return nil
}

func fmtF32(v float32) string { return strconv.FormatFloat(float64(v), 'g', -1, 32) }

func parseF32(s string) (float32, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 32)
	return float32(v), err
}
