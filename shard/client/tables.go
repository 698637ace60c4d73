package client

import (
	"context"
	"errors"
	"fmt"

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

// alteration is the request the options of one Alter build.
type alteration struct{ req shardpb.AlterTableRequest }

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
	return func(a *alteration) {
		a.req.SetHot, a.req.HotThreshold, a.req.HotReplicas = true, threshold, uint32(max(replicas, 0))
	}
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
	if req.Consistency == shardpb.Consistency_CONSISTENCY_UNSPECIFIED && req.StalenessBoundNs == 0 && !req.SetHot {
		return TableSpec{}, fmt.Errorf("altering table %q: %w: nothing to change", name, ErrBadRequest)
	}
	var out *shardpb.TableSpec
	err := t.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
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
