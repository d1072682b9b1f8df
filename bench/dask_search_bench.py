#!/usr/bin/env python3
"""tandem.dask.search with successive halving against the same grid trained in full, in one run.

The grid of bench/search_bench.sh (12 trials: lr 0.0003, 0.001, 0.003 x hidden 100, 300 x seed
1, 2; batch 1,000, Adam, one thread per trial) on Fashion-MNIST's first 55,000 training rows,
validated on the last 5,000, on a distributed.LocalCluster of W worker processes of one thread:

  - halving: search(..., budget=B, eta=3) (B=9: rungs at 1, 3 and 9 epochs; the top third of a
             rung go on);
  - full:    search(...) with epochs=B for every trial (no early stopping).

Both run REPEATS times, alternating, on the same cluster with the data already scattered once
per search. Prints a markdown table (seconds, trials/hour, epochs trained, best validation loss
per sample) and one JSON line with every run.

usage: PYTHONPATH=build/python python dask_search_bench.py [--workers 2] [--repeats 3] [--budget 9]
"""

import argparse
import gzip
import json
import statistics
import time

import numpy as np
from distributed import Client, LocalCluster

import tandem.dask as tdask

IDX_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def grid():
    return [{"learning_rate": lr, "layers": [784, hidden, 10], "seed": seed}
            for lr in (0.0003, 0.001, 0.003) for hidden in (100, 300) for seed in (1, 2)]


def run(client, kind, train, validation, budget):
    started = time.monotonic()
    if kind == "halving":
        results = tdask.search(client, grid(), train, validation, budget=budget, eta=3,
                               batch=1000)
        epochs = sum(r["epochs"] for r in results)
        best = min(r["best_validation_loss"] for r in results if "best_validation_loss" in r)
    else:
        results = tdask.search(client, grid(), train, validation, epochs=budget, batch=1000)
        epochs = sum(r.get("epochs", 0) for r in results)
        best = min(r["validation"]["loss_mean"] for r in results if "validation" in r)
    seconds = time.monotonic() - started
    failed = sum(1 for r in results if "error" in r)
    return {"kind": kind, "seconds": seconds, "trials": len(results), "failed": failed,
            "trials_per_hour": 3600 * len(results) / seconds, "epochs_trained": epochs,
            "best_validation_loss": best}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=int, default=9, help="epochs of the last rung")
    args = parser.parse_args()
    images = read_idx(f"{IDX_DIR}/train-images-idx3-ubyte.gz").reshape(-1, 784)
    labels = read_idx(f"{IDX_DIR}/train-labels-idx1-ubyte.gz")
    train, validation = (images[:55000], labels[:55000]), (images[55000:], labels[55000:])
    runs = []
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for _ in range(args.repeats):
            for kind in ("halving", "full"):
                runs.append(run(client, kind, train, validation, args.budget))
    print("| search | trials | epochs trained | seconds (median) | trials/hour (median) | "
          "all runs (trials/hour) | best val loss |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for kind in ("halving", "full"):
        mine = [r for r in runs if r["kind"] == kind]
        print(f"| {kind} | {mine[0]['trials']} | {mine[0]['epochs_trained']} | "
              f"{statistics.median(r['seconds'] for r in mine):.1f} | "
              f"{statistics.median(r['trials_per_hour'] for r in mine):.0f} | "
              f"{', '.join('%.0f' % r['trials_per_hour'] for r in mine)} | "
              f"{mine[0]['best_validation_loss']:.4f} |")
    print(json.dumps({"workers": args.workers, "budget": args.budget, "runs": runs}))


if __name__ == "__main__":
    main()
