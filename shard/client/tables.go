package client

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/protobuf/proto"
)

// Tables creates, alters, describes and lists tables. Get it from
// Client.Tables; it is safe for concurrent use.
type Tables struct{ c *Client }

// Tables returns the client's table API.
func (c *Client) Tables() *Tables { return &Tables{c: c} }

// Create creates a table and returns its spec with defaults filled in. It
// returns once the node that created it serves every shard, so the caller
// can push at once.
//
// An attempt whose outcome is unknown (a timeout, a leader change) is
// retried; if the retry finds the table already there with the spec this
// call asked for, that is this call's table, and Create succeeds. A table
// of that name with another spec is ErrTableExists.
func (t *Tables) Create(ctx context.Context, spec TableSpec) (TableSpec, error) {
	if err := spec.check(); err != nil {
		return TableSpec{}, fmt.Errorf("creating table %q: %w", spec.Name, err)
	}
	if err := checkHotKeys(spec.HotThreshold, spec.HotReplicas); err != nil {
		return TableSpec{}, fmt.Errorf("creating table %q: %w", spec.Name, err)
	}
	req := spec.proto()
	var out *shardpb.TableSpec
	maybeCreated := false // an earlier attempt may have created the table
	err := t.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		resp, err := s.CreateTable(ctx, &shardpb.CreateTableRequest{Spec: req})
		if err == nil {
			out = resp.Spec
			return nil
		}
		rerr := api.FromStatus(err)
		if maybeCreated && errors.Is(rerr, api.ErrTableExists) {
			if existing := sameTable(ctx, s, req); existing != nil {
				out = existing
				return nil
			}
		}
		if !errors.Is(rerr, api.ErrNotLeader) {
			maybeCreated = true
		}
		return err
	})
	if err != nil {
		return TableSpec{}, fmt.Errorf("creating table %q: %w", spec.Name, err)
	}
	t.c.setSpec(out)
	return specOf(out), nil
}

// sameTable returns the stored spec of spec's table if it is the one spec
// asks for (defaults filled in as the nodes fill them), else nil.
func sameTable(ctx context.Context, s shardpb.ParameterServerClient, spec *shardpb.TableSpec) *shardpb.TableSpec {
	want, err := api.NormalizeSpec(spec)
	if err != nil {
		return nil
	}
	d, err := s.DescribeTable(ctx, &shardpb.DescribeTableRequest{Name: spec.Name})
	if err != nil || !proto.Equal(d.Spec, want) {
		return nil
	}
	return d.Spec
}

// Describe returns a table's spec, every shard's placement and leader, and
// refreshes the client's caches of them.
func (t *Tables) Describe(ctx context.Context, name string) (TableInfo, error) {
	d, err := t.c.describe(ctx, name)
	if err != nil {
		return TableInfo{}, err
	}
	return tableInfoOf(d), nil
}

// List returns every table's spec, as the metadata leader has them.
func (t *Tables) List(ctx context.Context) ([]TableSpec, error) {
	var out []TableSpec
	err := t.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		resp, err := s.ListTables(ctx, &shardpb.ListTablesRequest{})
		if err != nil {
			return err
		}
		out = out[:0]
		for _, ts := range resp.Tables {
			out = append(out, specOf(ts))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	return out, nil
}

// AlterOption is one change of Alter.
type AlterOption func(*alteration)

// alteration is the request the options of one Alter build. The hot-key
// settings are kept apart until Alter: the server sets both at once, so
// one given alone is paired with the table's other one.
type alteration struct {
	req       shardpb.AlterTableRequest
	threshold *float64
	replicas  *int
}

// SetConsistency sets the table's level (and bound, for Bounded).
func SetConsistency(c Consistency) AlterOption {
	return func(a *alteration) {
		a.req.Consistency, a.req.StalenessBoundNs = c.Level.proto(), int64(c.Bound)
	}
}

// SetHotKeys sets both hot-key settings: keys pulled at least threshold
// times a second get replicas read replicas (0: the default, 2); a
// threshold of 0 turns hot keys off.
func SetHotKeys(threshold float64, replicas int) AlterOption {
	return func(a *alteration) { a.threshold, a.replicas = &threshold, &replicas }
}

// SetHotThreshold sets the hot-key threshold alone: the table's count of
// read replicas stays, unless the threshold is 0, which turns hot keys off
// and drops them.
func SetHotThreshold(threshold float64) AlterOption {
	return func(a *alteration) { a.threshold = &threshold }
}

// SetHotReplicas sets the count of hot keys' read replicas alone, of a
// table whose hot keys are on (ErrBadRequest otherwise).
func SetHotReplicas(replicas int) AlterOption {
	return func(a *alteration) { a.replicas = &replicas }
}

// checkHotKeys refuses hot-key settings the server would refuse, or
// silently drop (read replicas without a threshold), before anything is
// sent.
func checkHotKeys(threshold float64, replicas int) error {
	switch {
	case math.IsNaN(threshold) || math.IsInf(threshold, 0) || threshold < 0:
		return fmt.Errorf("%w: hot-key threshold %v: want pulls a second >= 0 (0 turns hot keys off)", ErrBadRequest, threshold)
	case replicas < 0 || replicas > api.MaxHotReplicas:
		return fmt.Errorf("%w: %d hot-key read replicas: want 0..%d", ErrBadRequest, replicas, api.MaxHotReplicas)
	case threshold == 0 && replicas > 0:
		return fmt.Errorf("%w: %d hot-key read replicas without a threshold: hot keys would be off, so there would be none", ErrBadRequest, replicas)
	}
	return nil
}

// hotKeys fills in a's hot-key settings: a setting given alone is paired
// with the table's other one, read from cur (called only then).
func (a *alteration) hotKeys(ctx context.Context, cur func(context.Context) (TableSpec, error)) error {
	if a.threshold == nil && a.replicas == nil {
		return nil
	}
	if a.threshold != nil && a.replicas == nil && *a.threshold <= 0 {
		a.replicas = new(int) // off: no read replicas
	}
	if a.threshold == nil || a.replicas == nil {
		spec, err := cur(ctx)
		if err != nil {
			return err
		}
		switch {
		case a.threshold == nil && spec.HotThreshold <= 0:
			return fmt.Errorf("%w: hot keys are off: set a threshold with the read replicas", ErrBadRequest)
		case a.threshold == nil:
			a.threshold = &spec.HotThreshold
		default:
			a.replicas = &spec.HotReplicas
		}
	}
	if err := checkHotKeys(*a.threshold, *a.replicas); err != nil {
		return err
	}
	a.req.SetHot, a.req.HotThreshold, a.req.HotReplicas = true, *a.threshold, uint32(*a.replicas)
	return nil
}

// Drop removes a table: its spec, and on every node its replicas and their
// data (each node deletes them within a second or so of the drop). A table
// that a job in the registry lists (its trainers named it when they
// joined) is refused with ErrTableInUse unless force is set. ErrUnknownTable
// if there is no such table, unless an earlier attempt of this call may
// have dropped it. The name may be used again at once: a table created
// under it starts empty on every node.
func (t *Tables) Drop(ctx context.Context, name string, force bool) error {
	if err := api.CheckTableName(name); err != nil {
		return fmt.Errorf("dropping table %q: %w", name, err)
	}
	maybeDropped := false
	err := t.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.DropTable(ctx, &shardpb.DropTableRequest{Name: name, Force: force})
		if err == nil {
			return nil
		}
		rerr := api.FromStatus(err)
		if maybeDropped && errors.Is(rerr, api.ErrUnknownTable) {
			return nil
		}
		// Only a NotLeader refusal proves the drop was not committed.
		if !errors.Is(rerr, api.ErrNotLeader) {
			maybeDropped = true
		}
		return err
	})
	t.c.forgetTable(name)
	if err != nil {
		return fmt.Errorf("dropping table %q: %w", name, err)
	}
	return nil
}

// Alter changes a table's consistency level or hot-key settings and
// returns the new spec. Each node serves the new level once its metadata
// replica has applied it; a pull that needs a stronger level at once asks
// for it (WithConsistency).
func (t *Tables) Alter(ctx context.Context, name string, opts ...AlterOption) (TableSpec, error) {
	var a alteration
	for _, o := range opts {
		o(&a)
	}
	req := &a.req
	req.Name = name
	if req.Consistency == shardpb.Consistency_CONSISTENCY_UNSPECIFIED && req.StalenessBoundNs == 0 && a.threshold == nil && a.replicas == nil {
		return TableSpec{}, fmt.Errorf("altering table %q: %w: nothing to change", name, ErrBadRequest)
	}
	err := a.hotKeys(ctx, func(ctx context.Context) (TableSpec, error) {
		// The metadata leader's spec (List), not a node's map (Describe):
		// a node that has not applied the last alter yet would hand back
		// the setting it replaced.
		specs, err := t.List(ctx)
		if err != nil {
			return TableSpec{}, err
		}
		for _, s := range specs {
			if s.Name == name {
				return s, nil
			}
		}
		return TableSpec{}, fmt.Errorf("%w: %q", ErrUnknownTable, name)
	})
	if err != nil {
		return TableSpec{}, fmt.Errorf("altering table %q: %w", name, err)
	}
	var out *shardpb.TableSpec
	err = t.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		resp, err := s.AlterTable(ctx, req)
		if err != nil {
			return err
		}
		out = resp.Spec
		return nil
	})
	if err != nil {
		return TableSpec{}, fmt.Errorf("altering table %q: %w", name, err)
	}
	t.c.setSpec(out)
	return specOf(out), nil
}
