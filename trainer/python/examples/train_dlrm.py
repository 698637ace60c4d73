#!/usr/bin/python3
"""Train a DLRM-like CTR model in PyTorch whose embeddings live in raftps.

    raftps data synthetic --examples 100000 --seed 1 --out /tmp/syn.tsv
    python3 train_dlrm.py --cluster 127.0.0.1:7001 --data /tmp/syn.tsv --world 2

The data is Criteo TSV (what `raftps data synthetic` writes, and what
`raftps train --data criteo:FILE` reads): categorical value v of field f
becomes the key MakeKey(f, FNV-1a-64(v)) exactly as the Go reader makes it,
so Go and Python train on the same keys. The last --holdout of the file is
held out; its Bayes-optimal AUC comes from FILE.json when raftps wrote it.

The model: one embedding bag per sample and field, all in one raftps table
(raftps.torch.EmbeddingBag: the table's optimizer updates them on the
nodes), their pairwise dot products (DLRM's interaction), the 13 integer
features through a bottom layer, and an MLP to the logit. With --world N it
starts N trainer processes: each trains on every N-th line, the dense part
is a DistributedDataParallel module (gloo allreduce), and the sparse rows
need no allreduce: each trainer pushes its own gradient, scaled by 1/N.
"""

import argparse
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import raftps  # noqa: E402
import raftps.torch as rt  # noqa: E402

DENSE, CATEGORICAL = 13, 26
FIELD_SHIFT = 56
ID_MASK = (1 << FIELD_SHIFT) - 1


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def load_criteo(path):
    """labels (n,), dense (n, 13) float32, keys (n, fields) int64 with -1
    for a missing value, and the fields that occur at all."""
    labels, dense, cats = [], [], []
    with open(path, "rb") as f:
        for line in f:
            cols = line.rstrip(b"\r\n").split(b"\t")
            if len(cols) == 1 and not cols[0]:
                continue
            if len(cols) != 1 + DENSE + CATEGORICAL:
                raise ValueError(f"{path}: a line of {len(cols)} columns, want {1 + DENSE + CATEGORICAL}")
            labels.append(float(cols[0]))
            dense.append([float(c) if c else 0.0 for c in cols[1:1 + DENSE]])
            cats.append(cols[1 + DENSE:])
    labels = np.array(labels, dtype=np.float32)
    dense = np.log1p(np.maximum(np.array(dense, dtype=np.float64), 0)).astype(np.float32)
    cats = np.array(cats, dtype=object)
    keys = np.full(cats.shape, -1, dtype=np.int64)
    fields = []
    for j in range(CATEGORICAL):
        col = cats[:, j]
        present = col != b""
        if not present.any():
            continue
        fields.append(j)
        uniq, inv = np.unique(col[present], return_inverse=True)
        # Hash each distinct value once: a vocabulary, not a per-line loop.
        hashed = np.array([(j << FIELD_SHIFT) | (fnv1a64(v) & ID_MASK) for v in uniq], dtype=np.uint64)
        keys[present, j] = hashed[inv].view(np.int64)
    return labels, dense, keys[:, fields], fields


def auc(labels, scores):
    """The ROC AUC, ties counted half (as trainer.AUC)."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


class Dense(torch.nn.Module):
    """Everything but the embeddings: bottom layer, interactions, top MLP."""

    def __init__(self, fields, dim, hidden):
        super().__init__()
        self.fields, self.dim = fields, dim
        self.bottom = torch.nn.Linear(DENSE, dim)
        n = fields + 1
        layers, width = [], fields * dim + dim + n * (n - 1) // 2
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
            width = h
        layers.append(torch.nn.Linear(width, 1))
        self.top = torch.nn.Sequential(*layers)
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("iu", iu, persistent=False)

    def forward(self, emb, dense):
        b = dense.shape[0]
        vecs = torch.cat([emb.view(b, self.fields, self.dim), self.bottom(dense).unsqueeze(1)], dim=1)
        dots = torch.bmm(vecs, vecs.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([vecs.reshape(b, -1), dots], dim=1)).squeeze(1)


def bags(keys):
    """The flat keys and offsets of one bag per (sample, field); a missing
    value is an empty bag."""
    flat = keys.reshape(-1)
    present = flat != -1
    lens = present.astype(np.int64)
    offsets = np.r_[0, np.cumsum(lens)[:-1]]
    return torch.from_numpy(flat[present]), torch.from_numpy(offsets)


def train(rank, args, world, port, result_q):
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    labels, dense, keys, fields = load_criteo(args.data)
    n_eval = int(round(args.holdout * len(labels)))
    n_train = len(labels) - n_eval
    mine = np.arange(rank, n_train, world)
    client = raftps.Client(args.cluster)
    emb = rt.EmbeddingBag(client, args.table, args.dim, mode="sum", grad_scale=1.0 / world)
    model = Dense(len(fields), args.dim, [int(h) for h in args.hidden.split(",") if h])
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.dense_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed + rank)
    # The step's batch is split among the trainers, so 1 and N trainers
    # take the same steps of the same size.
    batch = max(1, args.batch // world)
    steps_per_epoch = len(mine) // batch
    if world > 1:  # every rank must take as many steps (each is an allreduce)
        t = torch.tensor([steps_per_epoch])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        steps_per_epoch = int(t.item())
    start, step = time.time(), 0
    for epoch in range(args.epochs):
        perm = rng.permutation(mine)
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            flat, offsets = bags(keys[idx])
            e = emb(flat, offsets)
            logits = model(e, torch.from_numpy(dense[idx]))
            loss = loss_fn(logits, torch.from_numpy(labels[idx]))
            opt.zero_grad()
            loss.backward()  # DDP allreduces the dense part; emb pushes its rows
            opt.step()
            step += 1
            if rank == 0 and args.verbose and step % 200 == 0:
                print(f"step {step}: loss {loss.item():.4f}", file=sys.stderr)
    seconds = time.time() - start
    if world > 1:
        dist.barrier()  # every trainer's pushes are in before rank 0 evaluates
    if rank == 0:
        emb.eval()
        net = model.module if world > 1 else model
        scores = []
        with torch.no_grad():
            for lo in range(n_train, len(labels), 4096):
                idx = np.arange(lo, min(lo + 4096, len(labels)))
                flat, offsets = bags(keys[idx])
                scores.append(net(emb(flat, offsets), torch.from_numpy(dense[idx])).numpy())
        result = {"world": world, "steps": step, "train_seconds": round(seconds, 1),
                  "samples_per_s": round(step * batch * world / max(seconds, 1e-9)),
                  "auc": auc(labels[n_train:], np.concatenate(scores).astype(np.float64)), "eval": n_eval}
        meta = args.data + ".json"
        if os.path.exists(meta):
            with open(meta) as f:
                m = json.load(f)
            if m.get("eval") == n_eval:
                result["bayes_auc"] = m["bayes_auc"]
                result["gap"] = m["bayes_auc"] - result["auc"]
        result_q.put(result)
    client.close()
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default=os.environ.get("RAFTPS_CLUSTER", ""), help="node addresses (default $RAFTPS_CLUSTER)")
    p.add_argument("--data", required=True, help="Criteo TSV file (raftps data synthetic --out FILE)")
    p.add_argument("--holdout", type=float, default=0.1, help="fraction of the file, from its end, held out")
    p.add_argument("--table", default="", help="embedding table (default: a new one, py_dlrm_PID)")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", default="32,16")
    p.add_argument("--batch", type=int, default=512, help="samples per step, over all trainers (each takes batch/world)")
    p.add_argument("--epochs", type=int, default=2, help="passes over the training lines (one falls short of Bayes - 0.01 with 2 trainers)")
    p.add_argument("--dense-lr", type=float, default=0.01, help="Adam step of the dense part")
    p.add_argument("--optimizer", default="adagrad:lr=0.3,init_acc=0.01", help="the table's optimizer, when created")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--world", type=int, default=1, help="trainer processes (gloo)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", type=float, default=None, help="exit 1 unless AUC is within this of the Bayes-optimal AUC")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    args.table = args.table or f"py_dlrm_{os.getpid()}"
    with raftps.Client(args.cluster) as c:
        try:
            c.create_table(args.table, args.dim, optimizer=args.optimizer, initializer="uniform:0.05",
                           seed=args.seed, shards=args.shards)
        except raftps.TableExistsError:
            pass
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    if args.world == 1:
        train(0, args, 1, 0, q)
    else:
        mp.spawn(train, args=(args, args.world, free_port(), q), nprocs=args.world, join=True)
    result = q.get()
    print(json.dumps(result))
    if args.check is not None and not result.get("gap", 1.0) <= args.check:
        print(f"AUC {result['auc']:.4f} is not within {args.check} of the Bayes-optimal {result.get('bayes_auc')}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
