#!/usr/bin/python3
"""Pull or push rows/s of the Python client, measured as `raftps bench` does.

    python3 bench_client.py --cluster 127.0.0.1:7001 --table bench --workload pull

The same load as the Go bench (test/bench): each client cycles through 64
batches of --batch distinct keys drawn with Zipf exponent --zipf over --keys
keys, drawn before the clock starts, and pushes small fixed gradients. Each
client is its own raftps.Client on its own thread, as the Go bench gives each
client its own client.Client. make bench-python runs it beside raftps bench
on one cluster (docs/BENCHMARKS.md).
"""

import argparse
import json
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import raftps  # noqa: E402
from raftps.types import parse_duration  # noqa: E402

BATCHES_PER_CLIENT = 64


def draw_batches(keys, batch, zipf, seed):
    """64 batches of distinct Zipf-distributed keys below keys."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(BATCHES_PER_CLIENT):
        have = np.empty(0, dtype=np.uint64)
        draws = 0
        while len(have) < batch:
            need = batch - len(have)
            if draws > 64 * batch:  # a steep Zipf's head: fill uniformly
                k = rng.integers(0, keys, size=need)
            else:
                k = rng.zipf(zipf, size=4 * need) - 1
                k = k[k < keys]
            draws += 4 * need
            have = np.unique(np.r_[have, k.astype(np.uint64)])
        out.append(rng.permutation(have)[:batch])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default=os.environ.get("RAFTPS_CLUSTER", ""))
    p.add_argument("--table", required=True, help="an existing table (raftps bench --load fills it)")
    p.add_argument("--workload", choices=["pull", "push"], default="pull")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--keys", type=int, default=1000000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--duration", default="20s", help="how long to run (a Go duration, or seconds)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    clients = [raftps.Client(args.cluster) for _ in range(args.clients)]
    dim = clients[0].describe_table(args.table).spec.dim
    batches = [draw_batches(args.keys, args.batch, args.zipf, w) for w in range(args.clients)]
    grads = (np.random.default_rng(9).standard_normal((args.batch, dim)) * 0.01).astype(np.float32)
    rows, errors, lats = [0] * args.clients, [0] * args.clients, [[] for _ in range(args.clients)]
    for c in clients:  # connections and caches warm, as the Go bench's load pass leaves them
        c.pull(args.table, batches[0][0])
    deadline = time.monotonic() + parse_duration(args.duration)

    def run(w):
        c, bs, i = clients[w], batches[w], 0
        while time.monotonic() < deadline:
            keys = bs[i % len(bs)]
            i += 1
            t0 = time.monotonic()
            try:
                if args.workload == "push":
                    c.push(args.table, keys, grads)
                else:
                    c.pull(args.table, keys)
            except raftps.RaftpsError as e:
                errors[w] += 1
                print(f"client {w}: {e}", file=sys.stderr)
                continue
            lats[w].append(time.monotonic() - t0)
            rows[w] += args.batch

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(w,)) for w in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    lat = np.sort(np.concatenate([np.array(l) for l in lats])) * 1000 if any(lats) else np.zeros(1)
    res = {"client": "python", "workload": args.workload, "clients": args.clients, "batch": args.batch, "dim": dim,
           "seconds": round(elapsed, 1), "rows_per_s": round(sum(rows) / elapsed),
           "p50_ms": round(float(lat[len(lat) // 2]), 1), "p99_ms": round(float(lat[min(len(lat) - 1, int(0.99 * len(lat)))]), 1),
           "errors": sum(errors)}
    for c in clients:
        c.close()
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{args.workload} on {args.table} (python): {res['rows_per_s']} rows/s, batch latency p50 {res['p50_ms']} ms "
              f"p99 {res['p99_ms']} ms, {res['errors']} errors, {args.clients} clients x {args.batch} keys, {res['seconds']}s")


if __name__ == "__main__":
    main()
