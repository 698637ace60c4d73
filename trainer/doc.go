// Package trainer will own training: data (a synthetic CTR generator with a
// planted model, Criteo TSV and libsvm readers), models, the training loop in
// sync, async and SSP modes, evaluation and dense checkpoints. It talks to the
// cluster only through shard.Client and to other trainers through collective.
// Not built yet: see the issue "Trainers" and ../shared/DESIGN.md.
package trainer
