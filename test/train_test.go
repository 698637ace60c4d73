package test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/raftps/raftps/collective"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/trainer"
)

// smallData is synthetic CTR data with a vocabulary small enough that
// logistic regression gets near the Bayes-optimal AUC in a few seconds.
func smallData(t *testing.T) *trainer.Synthetic {
	cfg := trainer.DefaultSyntheticConfig()
	cfg.Fields, cfg.Vocab, cfg.WeightStd = 8, 100, 0.5
	s, err := trainer.NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTrainThroughLeaderKill trains logistic regression against the
// replicated cluster while the leader of a shard of its table is killed:
// training goes on through the failover (the client retries), and the model
// ends close to the Bayes-optimal AUC of the planted model.
func TestTrainThroughLeaderKill(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	cl := c.Client()
	if _, err := cl.CreateTable(ctx, &shardpb.TableSpec{Name: "lr", Dim: 1, Shards: shards, Optimizer: "sgd:lr=2", Initializer: "zeros"}); err != nil {
		t.Fatal(err)
	}
	killed := make(chan int, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		l := c.Leader("lr", 0, 5*time.Second)
		c.Kill(l)
		killed <- l
	}()
	res, err := trainer.Train(ctx, trainer.LoopConfig{
		PS: cl, Table: "lr", Model: trainer.LR{}, Data: smallData(t),
		Batch: 64, Steps: 1500, DenseLR: 2, EvalSamples: 20000,
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-killed:
		t.Logf("killed n%d, the leader of lr/0, during training", l+1)
	default:
		t.Fatal("training ended before the leader was killed: make it longer")
	}
	last := res.Evals[len(res.Evals)-1]
	t.Logf("%d steps in %.1fs: AUC %.4f (Bayes %.4f), logloss %.4f (Bayes %.4f)", res.Steps, res.Seconds, last.AUC, last.BayesAUC, last.LogLoss, last.BayesLogLoss)
	if last.AUC < last.BayesAUC-0.03 {
		t.Fatalf("AUC %.4f is not within 0.03 of the Bayes-optimal %.4f", last.AUC, last.BayesAUC)
	}
	if first := res.Evals[0]; !(last.AUC >= first.AUC-0.005) {
		t.Fatalf("AUC fell from %.4f to %.4f", first.AUC, last.AUC)
	}
}

// TestTrainSynchronousTrainers: two trainers share the table and average the
// dense gradient by allreduce every step; they end with bit-identical dense
// parameters and a model near the Bayes-optimal AUC.
func TestTrainSynchronousTrainers(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	if _, err := c.Client().CreateTable(ctx, &shardpb.TableSpec{Name: "lr", Dim: 1, Shards: shards, Optimizer: "sgd:lr=2", Initializer: "zeros"}); err != nil {
		t.Fatal(err)
	}
	const world = 2
	var lns []net.Listener
	var addrs []string
	for range world {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	data := smallData(t)
	results := make([]*trainer.Result, world)
	errs := make(chan error, world)
	for r := range world {
		go func() {
			g, err := collective.Join(ctx, collective.Config{Rank: r, Addrs: addrs, Job: "t", Generation: 1, Listener: lns[r]})
			if err != nil {
				errs <- err
				return
			}
			defer g.Close()
			results[r], err = trainer.Train(ctx, trainer.LoopConfig{
				PS: c.Client(), Table: "lr", Model: trainer.LR{}, Data: data, Group: g,
				Batch: 32, Steps: 1000, DenseLR: 2, EvalSamples: 20000,
			})
			errs <- err
		}()
	}
	for range world {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(results[0].Dense, results[1].Dense) {
		t.Fatalf("trainers ended with different dense parameters: %v vs %v", results[0].Dense, results[1].Dense)
	}
	last := results[0].Evals[len(results[0].Evals)-1]
	t.Logf("AUC %.4f (Bayes %.4f)", last.AUC, last.BayesAUC)
	if last.AUC < last.BayesAUC-0.03 {
		t.Fatalf("AUC %.4f is not within 0.03 of the Bayes-optimal %.4f", last.AUC, last.BayesAUC)
	}
}

// TestTrainTrainersMatchOne: two synchronous trainers with half the batch
// each train the same model as one trainer with the whole batch (the row
// gradients of a step are averaged over trainers like the dense ones), so
// their held-out AUCs agree within noise.
func TestTrainTrainersMatchOne(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	for _, name := range []string{"one", "two"} {
		if _, err := c.Client().CreateTable(ctx, &shardpb.TableSpec{Name: name, Dim: 1, Shards: shards, Optimizer: "sgd:lr=2", Initializer: "zeros"}); err != nil {
			t.Fatal(err)
		}
	}
	data := smallData(t)
	const steps = 600
	one, err := trainer.Train(ctx, trainer.LoopConfig{PS: c.Client(), Table: "one", Model: trainer.LR{}, Data: data, Batch: 64, Steps: steps, DenseLR: 2, EvalSamples: 20000})
	if err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	two := make([]*trainer.Result, 2)
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			g, err := collective.Join(ctx, collective.Config{Rank: r, Addrs: addrs, Job: "m", Generation: 1, Listener: lns[r]})
			if err != nil {
				errs <- err
				return
			}
			defer g.Close()
			two[r], err = trainer.Train(ctx, trainer.LoopConfig{PS: c.Client(), Table: "two", Model: trainer.LR{}, Data: data, Group: g,
				Batch: 32, Steps: steps, DenseLR: 2, EvalSamples: 20000})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The same SGD steps up to float rounding (the servers add the two
	// trainers' pushes in either order): the dense parameters (LR's bias)
	// and the AUC agree closely. Without averaging the row gradients over
	// trainers the sparse steps are twice as long, and the bias ends about
	// 4e-2 away and the AUC about 1e-3 (measured).
	a, b := one.Evals[len(one.Evals)-1].AUC, two[0].Evals[len(two[0].Evals)-1].AUC
	bias1, bias2 := one.Dense[0], two[0].Dense[0]
	t.Logf("one trainer (batch 64): AUC %.5f bias %.6f; two trainers (32 each): AUC %.5f bias %.6f", a, bias1, b, bias2)
	if d := a - b; d > 5e-4 || d < -5e-4 {
		t.Fatalf("one trainer reached AUC %.5f, two with the same global batch %.5f", a, b)
	}
	if d := bias1 - bias2; d > 1e-3 || d < -1e-3 {
		t.Fatalf("one trainer ended with bias %.6f, two with the same global batch %.6f", bias1, bias2)
	}
}
