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
//     (MakeKey, KeyField, KeyID).
//   - Synthetic: a CTR generator with a planted model. Per field, ids are
//     drawn from a Zipf distribution; each key's true weight (and optional
//     latent vector for a pairwise term) is a hash of (seed, key), so the
//     model needs no memory; labels are Bernoulli(sigmoid(z)). Sample i is a
//     function of (config, i), the same on every run and machine, and carries
//     its true probability, so BayesMetrics gives the best achievable AUC and
//     logloss of any sample set. DefaultSyntheticConfig has Criteo's shape:
//     26 fields of 100,000 ids, about 25% positives, Bayes AUC about 0.80.
//   - Readers: CriteoReader (Criteo TSV) and LibSVMReader; malformed lines
//     give an error wrapping ErrFormat that names the line.
//   - Metrics: AUC (exact, ties averaged) and LogLoss (clamped).
//   - Models, forward and backward in float32: LR (logistic regression, rows
//     of dim 1) and DLRM (per-field embedding bags concatenated with the dense
//     features, through an MLP). A Model owns no storage: it takes the rows
//     pulled for Batch.Keys and the flat dense parameters, and returns the
//     loss, the row gradients in the same layout (to push) and the dense
//     gradient (to allreduce); see Model for the step.
//
// Synthetic, the models and the metrics are safe for concurrent use and never
// modify a Batch or a Sample; a reader is for one goroutine.
//
//   - Train: the synchronous training loop. Each step pulls the batch's rows
//     from a ParamServer (shard.Client), computes gradients, pushes the row
//     gradients (the table's optimizer applies them on the servers) and, with
//     a collective.Group, averages the dense gradient by allreduce before an
//     SGD step, so every trainer holds the same dense parameters. It
//     evaluates on held-out synthetic samples against the Bayes-optimal AUC.
//     Train runs on the caller's goroutine; it does not retry pulls or
//     pushes itself (the client does, and only it can retry a push safely).
//
// # Not built yet
//
// Asynchronous and SSP modes, backup workers and straggler handling,
// prefetching the next batch, checkpoints of the dense parameters, training
// from the Criteo and libsvm readers in raftps train. See the issue
// "Trainers" and ../shared/DESIGN.md.
package trainer
