#!/usr/bin/env python3
"""Training fed from Dask (tandem.dask) against `tandem launch` on the same data, in one run.

Both train the same model (784-100-10, Adam, lr 0.01, batch 1,000, 1 thread per worker) with
1 parameter server, W workers and a scorer, in the same parameter-server mode, for a fixed time
(--seconds, the coordinator's max-seconds rule; no target, so training runs at full speed), on
Fashion-MNIST's 55,000 training rows (the last 5,000 held out for the scorer):

  - launch: `tandem launch --data STORE` (a store written by `tandem prepare` from the same IDX
    files), every role a process reading the store itself;
  - dask:   a distributed.LocalCluster of 1 + max(W) + 1 worker processes (2 threads each),
    already running with the data persisted in it as 10,000-row blocks (as the seed has it), then
    tandem.dask.start(...) and `while cluster.training: tandem.dask.feed(blocks, cluster)`: each
    Tandem worker trains on the blocks handed to it inside its own Dask worker process.

Figures, for both, with the same definitions:
  - samples/s (run): batches trained x batch / training seconds, the way `tandem launch --json`
    reports it. batches trained is the coordinator's batches_done at the stop (the workers'
    heartbeats, every 0.5 s); training seconds is the coordinator's training phase: launch
    reports it, and for Dask it is --seconds (the max-seconds rule ends the phase; launch's own
    figure shows how close that is).
  - samples/s (steady): the coordinator's state sampled once a second (launch: the cluster lines
    of RUN_DIR/metrics.jsonl; dask: cluster.state() from a thread), sum of the workers'
    batches_done between the 3rd sample in the training phase and the last one, x batch, over
    the time between them: start-up and the stop left out.
  - batches per step: batches trained / the servers' steps; in sync mode W for lockstep steps
    (every step averages one gradient of each worker), less when steps went on without a worker
    that had nothing to push (the server's step timeout).
  - first score: wall seconds from the start (launch: the process starting; dask: the call to
    tandem.dask.start, with the Dask cluster already up) to the first score, seen by polling
    every 10 ms (launch: RUN_DIR/metrics.jsonl; dask: the coordinator's scores), and the score's
    own t (seconds since the training phase began).

usage: dask_feed_bench.py [--tandem build/tools/tandem] [--store /tmp/fm.zarr] [--workers 1,2]
                          [--seconds 30] [--repeats 2] [--ps-mode sync] [--epochs-per-feed 1]
                          [--out DIR]
(with PYTHONPATH=build/python and a Python that has numpy and dask.distributed)
Prints a markdown table and one JSON line with every run; raw outputs go to --out.
"""

import argparse
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_args import positive_int_list  # noqa: E402

VALIDATION_ROWS = 5000


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def idx(data_dir, name):
    for p in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")):
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{name}(.gz) in {data_dir}")


def steady_rate(samples, batch):
    """samples: (seconds, phase, sum of workers' batches_done), about one a second."""
    training = [s for s in samples if s[1] == "training"]
    if len(training) < 4:
        return None
    (t0, _, b0), (t1, _, b1) = training[2], training[-1]
    return (b1 - b0) * batch / (t1 - t0) if t1 > t0 else None


# --- tandem launch --------------------------------------------------------------------------

def run_launch(args, workers, run_dir):
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.tandem, "launch", "--data", args.store, "--ps", "1", "--workers", str(workers),
           "--scorer", "1", "--target", "0", "--max-epochs", "0", "--max-seconds", str(args.seconds),
           "--ps-mode", args.ps_mode, "--batch", str(args.batch), "--hidden", "100",
           "--lr", "0.01", "--checkpoint-every", "0", "--dashboard", "-1",
           "--run-dir", run_dir, "--json"]
    started = time.monotonic()
    with open(os.path.join(run_dir, "stderr.txt"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        first_score = None
        while proc.poll() is None and first_score is None:
            try:
                with open(metrics) as f:
                    for line in f:
                        if '"type":"score"' in line:
                            first_score = (time.monotonic() - started, json.loads(line)["t"])
                            break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=args.seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}; see {run_dir}/stderr.txt")
    summary = json.loads(out.strip().splitlines()[-1])
    samples = []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "cluster":
                samples.append((j["elapsed_s"], j["state"],
                                sum(w.get("batches_done", 0) for w in j["workers"])))
    return {
        "kind": "launch", "workers": workers, "stop_reason": summary["stop_reason"],
        "seconds": summary["seconds"], "batches": summary["batches"], "steps": summary["steps"],
        "samples_per_s": summary["samples_per_s"],
        "steady_samples_per_s": steady_rate(samples, args.batch),
        "first_score_s": first_score[0] if first_score else None,
        "first_score_t": first_score[1] if first_score else None,
        "scores": summary["scores"], "final_score": summary["final_score"],
        "test_accuracy": summary["test"]["accuracy"],
    }


# --- tandem.dask ----------------------------------------------------------------------------

def run_dask(args, client, blocks, validation, test, workers):
    import tandem.dask

    started = time.monotonic()
    cluster, _ = tandem.dask.start(client, ps=1, worker=workers, scorer=1, validation=validation,
                                   target=None, max_seconds=args.seconds, batch=args.batch,
                                   lr=0.01, model="784-100-10", ps_mode=args.ps_mode)
    start_s = time.monotonic() - started
    samples, first_score, done = [], [], threading.Event()

    def watch():  # the first score (10 ms polls), then the state once a second
        next_sample = time.monotonic()
        while not done.is_set():
            now = time.monotonic()
            if not first_score:
                scores = cluster.coordinator.scores()
                if scores:
                    first_score.append((now - started, scores[0]["t"]))
            if now >= next_sample:
                state = cluster.state()
                samples.append((now - started, state["cluster"]["state"],
                                sum(w["batches_done"] for w in state["workers"])))
                next_sample += 1.0
            done.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rounds = 0
    try:
        while cluster.training:
            tandem.dask.feed(blocks * args.epochs_per_feed, cluster)
            rounds += 1
    finally:
        done.set()
        watcher.join()
    result = tandem.dask.stop(cluster)
    state = result["state"]["cluster"]
    scores = result["scores"]
    return {
        "kind": "dask", "workers": workers, "stop_reason": result["stop_reason"],
        "seconds": float(args.seconds), "batches": state["batches_done"], "steps": state["step"],
        "samples_per_s": state["batches_done"] * args.batch / args.seconds,
        "steady_samples_per_s": steady_rate(samples, args.batch),
        "first_score_s": first_score[0][0] if first_score else None,
        "first_score_t": first_score[0][1] if first_score else None,
        "start_s": start_s, "feed_rounds": rounds,
        "rows_fed": sum(r.get("rows_fed", 0) for r in result["roles"]),
        "scores": len(scores), "final_score": scores[-1]["loss"] if scores else None,
        "test_accuracy": result["model"].evaluate(*test)["accuracy"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tandem", default="build/tools/tandem")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--store", default="", help="a store of --data (tandem prepare); made if missing")
    p.add_argument("--workers", type=positive_int_list, default=[1, 2])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rows", type=int, default=10000, help="rows per block fed from Dask")
    p.add_argument("--ps-mode", default="sync")
    p.add_argument("--epochs-per-feed", type=int, default=1,
                   help="passes over the blocks per feed() call (1: the seed's loop)")
    p.add_argument("--out", default="")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="dask_feed_bench.")
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "runs.jsonl"), "w").close()  # this run's lines only
    if not args.store:
        args.store = os.path.join(out, "fm.zarr")
    if not os.path.exists(args.store):
        subprocess.run([args.tandem, "prepare", "--data", args.data, "--out", args.store],
                       check=True, stdout=subprocess.DEVNULL)
    print(f"load average before: {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)

    from distributed import Client, LocalCluster, wait

    images = read_idx(idx(args.data, "train-images-idx3-ubyte")).reshape(-1, 784)
    labels = read_idx(idx(args.data, "train-labels-idx1-ubyte"))
    train_rows = len(images) - VALIDATION_ROWS
    test = (read_idx(idx(args.data, "t10k-images-idx3-ubyte")).reshape(-1, 784),
            read_idx(idx(args.data, "t10k-labels-idx1-ubyte")))
    runs = []
    with LocalCluster(n_workers=2 + max(args.workers), threads_per_worker=2, processes=True,
                      dashboard_address=":0") as lc, Client(lc) as client:
        # The data in the Dask workers' memory, in blocks, before anything is timed (the seed
        # persists and computes its batches first too).
        blocks = client.scatter([(images[b:min(b + args.rows, train_rows)].copy(),
                                  labels[b:min(b + args.rows, train_rows)].copy())
                                 for b in range(0, train_rows, args.rows)])
        validation = tuple(client.scatter([a[-VALIDATION_ROWS:].copy() for a in (images, labels)]))
        wait(blocks + list(validation))
        for repeat in range(args.repeats):
            for w in args.workers:
                for kind in ("launch", "dask"):
                    if kind == "launch":
                        r = run_launch(args, w, os.path.join(out, f"launch-{w}-{repeat}"))
                    else:
                        r = run_dask(args, client, blocks, validation, test, w)
                    r["repeat"] = repeat
                    runs.append(r)
                    with open(os.path.join(out, "runs.jsonl"), "a") as f:
                        f.write(json.dumps(r) + "\n")
                    print(f"{kind:6s} W={w} #{repeat}: {r['samples_per_s']:,.0f} samples/s run, "
                          f"{(r['steady_samples_per_s'] or 0):,.0f} steady, first score "
                          f"{r['first_score_s']:.2f} s (t {r['first_score_t']:.2f}), "
                          f"{r['stop_reason']}, {r['seconds']:.1f} s, test acc "
                          f"{r['test_accuracy']:.4f}", flush=True)
        # Dask is still usable after the runs.
        assert client.submit(lambda x: x + 1, 1, pure=False).result(timeout=30) == 2
    print(f"load average after: {' '.join(open('/proc/loadavg').read().split()[:3])}")

    def med(kind, w, key):
        values = [r[key] for r in runs if r["kind"] == kind and r["workers"] == w and r[key] is not None]
        return statistics.median(values) if values else float("nan")

    def all_of(kind, w, key, fmt):
        return " / ".join(fmt.format(r[key]) for r in runs if r["kind"] == kind and r["workers"] == w)

    print()
    print(f"ps mode {args.ps_mode}, batch {args.batch}, {args.epochs_per_feed} epoch(s) per feed() "
          f"call, {args.seconds:g} s per run, "
          f"{args.repeats} runs each (interleaved); medians, all runs after |")
    print("| workers | run | samples/s (run) | samples/s (steady) | first score (s) | score t (s) "
          "| batches per step | test accuracy |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        r["batches_per_step"] = r["batches"] / r["steps"] if r["steps"] else None
    table = []
    for w in args.workers:
        for kind in ("launch", "dask"):
            print(f"| {w} | {kind} | {med(kind, w, 'samples_per_s'):,.0f} "
                  f"({all_of(kind, w, 'samples_per_s', '{:,.0f}')}) "
                  f"| {med(kind, w, 'steady_samples_per_s'):,.0f} "
                  f"({all_of(kind, w, 'steady_samples_per_s', '{:,.0f}')}) "
                  f"| {med(kind, w, 'first_score_s'):.2f} ({all_of(kind, w, 'first_score_s', '{:.2f}')}) "
                  f"| {med(kind, w, 'first_score_t'):.2f} "
                  f"| {med(kind, w, 'batches_per_step'):.2f} "
                  f"| {med(kind, w, 'test_accuracy'):.4f} |")
        ratio = {key: med("dask", w, key) / med("launch", w, key)
                 for key in ("samples_per_s", "steady_samples_per_s", "first_score_s")}
        print(f"| {w} | dask / launch | {ratio['samples_per_s']:.2f} | "
              f"{ratio['steady_samples_per_s']:.2f} | {ratio['first_score_s']:.2f} | | | |")
        table.append({"workers": w, **{f"ratio_{k}": v for k, v in ratio.items()}})
    print()
    print(json.dumps({"ps_mode": args.ps_mode, "seconds": args.seconds, "batch": args.batch,
                      "epochs_per_feed": args.epochs_per_feed,
                      "ratios": table, "runs": runs}))
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
