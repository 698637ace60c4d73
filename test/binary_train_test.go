package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftps/raftps/trainer"
)

// killAfterLine starts cmd and SIGKILLs it once its stderr has printed a
// line containing line (or after two minutes).
func killAfterLine(t *testing.T, cmd *exec.Cmd, line string) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	for sc.Scan() {
		if strings.Contains(sc.Text(), line) {
			break
		}
	}
	deadline.Stop()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

func runTrain(t testing.TB, bin string, args ...string) trainer.Summary {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"train", "--json", "--quiet"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("raftps train %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var s trainer.Summary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	return s
}

// TestBinaryTrainModes: raftps train runs three trainer processes in SSP
// mode, and in sync mode with a backup worker while rank 2 is slowed 3x: the
// slowed trainer's gradients come late and are discarded, and the job still
// learns. The trainers of the backup job find each other through the
// cluster's job registry.
func TestBinaryTrainModes(t *testing.T) {
	bin, _, addrs := binaryCluster(t, unsafeNoFsync)
	ssp := runTrain(t, bin, "--cluster", addrs, "--trainers", "3", "--mode", "ssp:2", "--steps", "200", "--job", "ssp")
	t.Logf("ssp:2, 3 trainers: AUC %.4f (Bayes %.4f), %.0f examples/s", ssp.FinalAUC, ssp.BayesAUC, ssp.ExamplesPerS)
	if ssp.Steps != 200 || ssp.Trainers != 3 || ssp.Examples != 3*200*64 || ssp.FinalAUC < 0.7 {
		t.Errorf("ssp: %+v; want 200 steps of 3 trainers, all their examples and AUC above 0.7", ssp)
	}
	bk := runTrain(t, bin, "--cluster", addrs, "--trainers", "3", "--backup-workers", "1", "--slow-rank", "2", "--slowdown", "3", "--steps", "200", "--job", "backup")
	t.Logf("sync with 1 backup worker, rank 2 slowed 3x: AUC %.4f (Bayes %.4f), %.0f examples/s, rank 0 late %d times", bk.FinalAUC, bk.BayesAUC, bk.ExamplesPerS, bk.Late)
	if bk.Steps != 200 || !strings.Contains(bk.Mode, "1 backup") || bk.FinalAUC < 0.7 {
		t.Errorf("backup: %+v; want 200 steps in sync mode with 1 backup worker and AUC above 0.7", bk)
	}
	// Each step takes 2 gradients; the slowed trainer's are mostly late, so
	// the job used fewer than 3 trainers' examples.
	if bk.Examples >= 3*200*64 || bk.Examples < 2*200*64 {
		t.Errorf("backup: the job used %d examples; want 2 trainers' %d up to fewer than 3 trainers' %d", bk.Examples, 2*200*64, 3*200*64)
	}
	// A libsvm file of the planted data: no Bayes-optimal AUC to compare.
	data, err := trainer.NewSynthetic(trainer.DefaultSyntheticConfig())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, x := range data.Samples(0, 10000) {
		fmt.Fprintf(&b, "%d", int(x.Label))
		for _, k := range x.Keys {
			fmt.Fprintf(&b, " %d:1", trainer.KeyField(k)*100+int(trainer.KeyID(k)))
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "train.libsvm")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "train", "--cluster", addrs, "--data", "libsvm:"+path, "--steps", "300", "--json", "--quiet", "--job", "file")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("train on a libsvm file: %v", err)
	}
	var file map[string]any
	if err := json.Unmarshal(out, &file); err != nil {
		t.Fatal(err)
	}
	t.Logf("libsvm file: AUC %v, Bayes %v", file["final_auc"], file["bayes_auc"])
	if auc, _ := file["final_auc"].(float64); auc < 0.7 || file["bayes_auc"] != nil {
		t.Errorf("libsvm file: final_auc %v, bayes_auc %v; want above 0.7 and null", file["final_auc"], file["bayes_auc"])
	}
}

// TestBinaryTrainResumes: a trainer process killed with SIGKILL and started
// again resumes from the job's checkpoint in the cluster, and finishes.
func TestBinaryTrainResumes(t *testing.T) {
	bin, _, addrs := binaryCluster(t, unsafeNoFsync)
	args := []string{"--cluster", addrs, "--job", "resume", "--steps", "2000", "--checkpoint-every", "50"}
	// Kill it once it has passed step 600 (progress lines every 200 steps).
	killAfterLine(t, exec.Command(bin, append([]string{"train"}, args...)...), "step 600/2000")
	res := runTrain(t, bin, args...)
	t.Logf("resumed at step %d, finished %d: AUC %.4f (Bayes %.4f)", res.FirstStep, res.Steps, res.FinalAUC, res.BayesAUC)
	if res.FirstStep < 601 || res.FirstStep%50 != 1 || res.Steps != 2000 {
		t.Fatalf("resumed from step %d to %d; want after a checkpoint (every 50 steps) past step 600, to 2000", res.FirstStep, res.Steps)
	}
	if res.FinalAUC < float64(res.BayesAUC)-0.02 {
		t.Fatalf("AUC %.4f after resuming, Bayes %.4f", res.FinalAUC, res.BayesAUC)
	}
}

// BenchmarkTimeToAccuracy (make bench-train) trains logistic regression with
// four trainer processes on one 3-node cluster in every mode, one trainer
// slowed 3x (and, as the reference, sync without a straggler), and reports
// the training time until the held-out AUC came within 0.01 of the
// Bayes-optimal one (s_to_target; 0 if it never did) and the job's
// examples/s. The modes run one after the other on the same cluster, so
// compare them as ratios.
func BenchmarkTimeToAccuracy(b *testing.B) {
	bin, _, addrs := binaryCluster(b)
	slow := []string{"--slow-rank", "3", "--slowdown", "3"}
	for _, m := range []struct {
		name string
		args []string
	}{
		{"sync-no-straggler", []string{"--mode", "sync"}},
		{"sync", append([]string{"--mode", "sync"}, slow...)},
		{"async", append([]string{"--mode", "async"}, slow...)},
		{"ssp2", append([]string{"--mode", "ssp:2"}, slow...)},
		{"ssp8", append([]string{"--mode", "ssp:8"}, slow...)},
		{"sync-1-backup", append([]string{"--mode", "sync", "--backup-workers", "1"}, slow...)},
	} {
		b.Run(m.name, func(b *testing.B) {
			for i := range b.N {
				args := append([]string{"--cluster", addrs, "--trainers", "4", "--steps", "3000", "--eval-every", "50", "--eval-samples", "10000",
					"--checkpoint-every", "0", "--job", fmt.Sprintf("tta-%s-%d", m.name, i)}, m.args...)
				s := runTrain(b, bin, args...)
				tt := 0.0
				if s.TimeToTarget.Known() {
					tt = float64(s.TimeToTarget)
				}
				b.ReportMetric(tt, "s_to_target")
				b.ReportMetric(s.ExamplesPerS, "examples/s")
				b.ReportMetric(s.FinalAUC, "final_auc")
				b.ReportMetric(float64(s.BayesAUC), "bayes_auc")
				b.ReportMetric(s.WallS, "train_s")
			}
		})
	}
}

// TestBinaryTrainReforms: two trainer processes of a sync job find each
// other through the cluster's job registry; trainer 1 is killed with
// SIGKILL mid-run and started again. Trainer 0's allreduce fails, it joins
// the registry's next round, the restarted trainer completes the round, and
// both resume from the checkpoint and finish.
func TestBinaryTrainReforms(t *testing.T) {
	bin, _, addrs := binaryCluster(t, unsafeNoFsync)
	args := []string{"train", "--cluster", addrs, "--job", "reform", "--world", "2", "--steps", "1000", "--checkpoint-every", "50"}
	zero := exec.Command(bin, append(args, "--rank", "0", "--json")...)
	var zeroErr strings.Builder
	zero.Stderr = &zeroErr
	var zeroOut strings.Builder
	zero.Stdout = &zeroOut
	if err := zero.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zero.Process.Kill() }()
	killAfterLine(t, exec.Command(bin, append(args, "--rank", "1")...), "step 200/1000")
	again := exec.Command(bin, append(args, "--rank", "1", "--quiet")...)
	if out, err := again.CombinedOutput(); err != nil {
		t.Fatalf("restarted trainer 1: %v\n%s", err, out)
	}
	if err := zero.Wait(); err != nil {
		t.Fatalf("trainer 0: %v\n%s", err, zeroErr.String())
	}
	var res trainer.Summary
	if err := json.Unmarshal([]byte(zeroOut.String()), &res); err != nil {
		t.Fatalf("trainer 0's summary %q: %v", zeroOut.String(), err)
	}
	t.Logf("trainer 0 resumed at step %d and finished %d: AUC %.4f (Bayes %.4f)", res.FirstStep, res.Steps, res.FinalAUC, res.BayesAUC)
	if !strings.Contains(zeroErr.String(), "re-forming") || res.FirstStep < 201 || res.FirstStep%50 != 1 || res.Steps != 1000 {
		t.Fatalf("trainer 0 went from step %d to %d; want a re-formed group resuming after a checkpoint past step 200, to 1000. Its log:\n%s", res.FirstStep, res.Steps, zeroErr.String())
	}
}
