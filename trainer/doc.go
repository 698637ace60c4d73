// Package trainer trains CTR models against a raftps cluster: the embedding
// rows live in raftps tables, the small dense network is replicated on every
// trainer.
//
// # What it owns now
//
// Data, models and metrics are pure (no I/O beyond an io.Reader, no
// goroutines, no clock); Train drives them against the cluster.
//
//   - Data. Sample (sparse keys with optional values, dense features, label,
//     true probability) and Batch (a mini-batch with its keys deduplicated in
//     a fixed order). Keys are global uint64s with the field in the top 8 bits
//     (MakeKey, KeyField, KeyID). A Dataset gives samples by index: Synthetic
//     (endless) or a SampleSet read from a file (read in epochs; LoadSpec
//     reads criteo:PATH or libsvm:PATH and holds out the file's tail).
//   - Synthetic: a CTR generator with a planted model. Per field, ids are
//     drawn from a Zipf distribution; each key's true weight (and optional
//     latent vector for a pairwise term) is a hash of (seed, key), so the
//     model needs no memory; labels are Bernoulli(sigmoid(z)). Sample i is a
//     function of (config, i), the same on every run and machine, and carries
//     its true probability, so BayesMetrics gives the best achievable AUC and
//     logloss of any sample set. DefaultSyntheticConfig (8 fields of 100 ids,
//     25% positives, Bayes AUC 0.81) is learnable in seconds;
//     CriteoScaleSyntheticConfig has Criteo's 26 fields of 100,000 ids.
//   - Readers: CriteoReader (Criteo TSV) and LibSVMReader; malformed lines
//     give an error wrapping ErrFormat that names the line.
//   - Metrics: AUC (exact, ties averaged) and LogLoss (clamped).
//   - Models, forward and backward in float32: LR (logistic regression, rows
//     of dim 1) and DLRM (per-field embedding bags concatenated with the dense
//     features, through an MLP). A Model owns no storage: it takes the rows
//     pulled for Batch.Keys and the flat dense parameters, and returns the
//     loss, the row gradients in the same layout (to push) and the dense
//     gradient (to allreduce); see Model for the step.
//   - Train, in three modes (Mode):
//   - sync: pull, gradients, push, then allreduce of the dense gradient
//     (the step's barrier: every push of step t is acknowledged before any
//     trainer pulls for t+1), so every trainer holds the same dense
//     parameters. With a Quorum (backup workers) trainer 0 keeps the dense
//     parameters and each step takes the first N-B gradients; late trainers
//     push nothing for that step and catch up with the latest state.
//   - async: the dense parameters live in the job's dense table (optimizer
//     sgd:lr=1; trainers push DenseLR times their gradient); no trainer
//     waits, and the next batch's rows are prefetched during the current
//     step's compute.
//   - ssp:S: as async without the prefetch (a trainer must read its own
//     last push), and a trainer starts step t only when every trainer's
//     clock, kept in the job's state table, has reached t-1-S.
//   - Job state (jobstate.go): the state table (optimizer assign) holds the
//     trainers' clocks, the sync checkpoint of the dense parameters (two
//     slots; the header naming the live one is written last) and the dense
//     table's initialised marker. A sync job restarted under its name resumes
//     after the checkpoint; async and SSP trainers after their own clock.
//   - Jobs (job.go): RunJob is one trainer process's part in a job against
//     a cluster (raftps train): it creates the job's tables, forms the
//     trainer group (a static list, or the cluster's job registry, which it
//     re-forms from if a peer dies) and runs Train; RunLocal runs a whole
//     sync job's trainers in one process (the demo); Summarize is a result
//     as raftps train --json prints it. This is the package's only use of
//     the cluster, through shard/client.
//
// Synthetic, the models and the metrics are safe for concurrent use and never
// modify a Batch or a Sample; a reader is for one goroutine. Train runs on
// the caller's goroutine plus one that prepares the next batches and, in
// async mode, one prefetching the next rows; it does not retry pulls or
// pushes itself (the client does, and only it can retry a push safely).
//
// Trainer 0 evaluates on the held-out set; training time (Result.Seconds,
// Eval.Seconds) excludes evaluations so that the time-to-accuracy of modes
// compares training alone.
package trainer
