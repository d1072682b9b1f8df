#!/usr/bin/python3
"""PyTorch (CPU) reference for Tandem's MLP training/inference throughput.

What it measures
----------------
The same model and step as Tandem's CPU benchmark, written in plain PyTorch:

  * MLP 784 -> 100 (ReLU) -> 10 (softmax).  hid_w [784,100] truncated normal
    with stddev 1/28, sm_w [100,10] truncated normal with stddev 1/sqrt(100)
    (both redrawn beyond 2 stddev), zero biases.
  * train step: forward (x @ hid_w + hid_b, relu, @ sm_w + sm_b),
    loss = -sum(log(clamp(softmax(logits), 1e-10, 1)) at the labels) summed
    over the batch, backward, torch.optim.Adam(lr=0.01, betas=(0.9, 0.999),
    eps=1e-8) step.
  * infer step: forward to the logits (no autograd) + argmax over the batch.
  * Data: Fashion-MNIST's 55,000 training images (the 60,000 minus the first
    5,000, which TensorFlow's read_data_sets keeps for validation), scaled to
    [0,1], resident in memory as one float32 tensor.  Batches are contiguous
    slices taken in order: offsets 0, B, 2B, ... while a whole batch fits,
    then back to 0 (so every batch is a zero-copy view).

For each batch size it warms up (at least 5 steps and 0.5 s), then times
whole steps until at least --seconds have passed, and prints one line per
(mode, batch).  With --json each line is a JSON object:

  {"impl": "pytorch", "mode": "train", "batch": 100, "threads": 2,
   "samples_per_s": ..., "steps": ..., "seconds": ..., ...}

Threads: --threads N calls torch.set_num_threads(N).  PyTorch's OpenMP
workers spin-wait by default, which starves OpenBLAS's own threads on a
2-vCPU machine, so OMP_WAIT_POLICY defaults to "passive" here (it is set
before torch is imported; an explicit value in the environment wins and is
reported in the output).

--accuracy-epochs N instead trains for N epochs with shuffled batches (the
first --batch value, default 100) and prints the test accuracy on the t10k
set after each epoch: a reference for Tandem's accuracy, not a timing.

How to run (Debian's python3-torch, CPU only):

  OMP_WAIT_POLICY=passive /usr/bin/python3 bench/torch_reference.py \
      --batch 100,1000,10000 --seconds 3 --threads 2 --mode both --json
  /usr/bin/python3 bench/torch_reference.py --accuracy-epochs 5 --batch 100

bench/compare_cpu.py runs this script with --threads 1 and 2 and compares
the best against Tandem's benchmark binary.
"""

import argparse
import gzip
import json
import os
import sys
import time

# Must happen before torch (and its OpenMP runtime) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_args import positive_int_list

DATA_DIR = "/usr/share/datasets/fashion-mnist"
VALIDATION_SIZE = 5000  # TF read_data_sets convention: first 5,000 held out

INPUT, HIDDEN, CLASSES = 784, 100, 10
LEARNING_RATE = 0.01

WARMUP_STEPS = 5
WARMUP_SECONDS = 0.5


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def read_idx(path, header_bytes):
    """Return the payload of a gzipped IDX file as a uint8 numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=header_bytes)


def load_split(data_dir, prefix, skip=0):
    """Load images ([N,784] float32 in [0,1]) and labels ([N] int64)."""
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 8)
    images = images.reshape(-1, INPUT)
    if images.shape[0] != labels.shape[0]:
        raise ValueError("%s: %d images but %d labels"
                         % (prefix, images.shape[0], labels.shape[0]))
    images = images[skip:].astype(np.float32) / np.float32(255.0)
    labels = labels[skip:].astype(np.int64)
    return (torch.from_numpy(np.ascontiguousarray(images)),
            torch.from_numpy(np.ascontiguousarray(labels)))


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------

def truncated_normal(shape, std):
    t = torch.empty(shape, dtype=torch.float32)
    torch.nn.init.trunc_normal_(t, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)
    return t.requires_grad_()


class MLP:
    def __init__(self):
        self.hid_w = truncated_normal((INPUT, HIDDEN), 1.0 / 28.0)
        self.hid_b = torch.zeros(HIDDEN, requires_grad=True)
        self.sm_w = truncated_normal((HIDDEN, CLASSES), 1.0 / HIDDEN ** 0.5)
        self.sm_b = torch.zeros(CLASSES, requires_grad=True)
        self.params = [self.hid_w, self.hid_b, self.sm_w, self.sm_b]
        self.opt = torch.optim.Adam(self.params, lr=LEARNING_RATE,
                                    betas=(0.9, 0.999), eps=1e-8)

    def logits(self, x):
        hidden = torch.relu(x @ self.hid_w + self.hid_b)
        return hidden @ self.sm_w + self.sm_b

    def train_step(self, x, y):
        log_p = torch.clamp(torch.softmax(self.logits(x), 1), 1e-10, 1.0).log()
        loss = -log_p.gather(1, y.unsqueeze(1)).sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def predict(self, x):
        with torch.no_grad():
            return self.logits(x).argmax(1)


# --------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------

def batch_offsets(n, batch):
    """Start offsets of the contiguous batches, in order, wrapping to 0."""
    if batch > n:
        raise ValueError("batch %d larger than the data set (%d)" % (batch, n))
    return list(range(0, n - batch + 1, batch))


def measure(mode, batch, images, labels, seconds):
    """Warm up, then time whole steps for at least `seconds`."""
    model = MLP()
    offsets = batch_offsets(images.shape[0], batch)
    if mode == "train":
        step = model.train_step
    else:
        step = lambda x, _y: model.predict(x)  # noqa: E731

    i = 0

    def one_step():
        nonlocal i
        off = offsets[i]
        i = (i + 1) % len(offsets)
        step(images[off:off + batch], labels[off:off + batch])

    start = time.perf_counter()
    warm = 0
    while warm < WARMUP_STEPS or time.perf_counter() - start < WARMUP_SECONDS:
        one_step()
        warm += 1

    steps = 0
    start = time.perf_counter()
    while True:
        one_step()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return steps, elapsed


def run_throughput(args, threads):
    images, labels = load_split(args.data_dir, "train", skip=VALIDATION_SIZE)
    modes = ["train", "infer"] if args.mode == "both" else [args.mode]
    for mode in modes:
        for batch in args.batch:
            steps, elapsed = measure(mode, batch, images, labels, args.seconds)
            rec = {
                "impl": "pytorch",
                "mode": mode,
                "batch": batch,
                "threads": threads,
                "samples_per_s": steps * batch / elapsed,
                "steps": steps,
                "seconds": elapsed,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
                "torch_version": torch.__version__,
            }
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print("pytorch %-5s batch %6d threads %d: %12.0f samples/s "
                      "(%d steps in %.3f s)"
                      % (mode, batch, threads, rec["samples_per_s"], steps,
                         elapsed), flush=True)


# --------------------------------------------------------------------------
# Accuracy reference
# --------------------------------------------------------------------------

def run_accuracy(args, threads):
    images, labels = load_split(args.data_dir, "train", skip=VALIDATION_SIZE)
    test_images, test_labels = load_split(args.data_dir, "t10k")
    batch = args.batch[0]
    model = MLP()
    n = images.shape[0]
    for epoch in range(1, args.accuracy_epochs + 1):
        start = time.perf_counter()
        perm = torch.randperm(n)
        loss_sum = 0.0
        for off in range(0, n, batch):
            idx = perm[off:off + batch]
            loss_sum += float(model.train_step(images[idx], labels[idx]))
        train_s = time.perf_counter() - start
        correct = int((model.predict(test_images) == test_labels).sum())
        acc = correct / test_labels.shape[0]
        rec = {
            "impl": "pytorch",
            "mode": "accuracy",
            "epoch": epoch,
            "batch": batch,
            "threads": threads,
            "test_accuracy": acc,
            "mean_loss_per_sample": loss_sum / n,
            "train_seconds": train_s,
        }
        if args.json:
            print(json.dumps(rec), flush=True)
        else:
            print("epoch %3d: test accuracy %.4f  mean loss %.4f  (%.1f s)"
                  % (epoch, acc, loss_sum / n, train_s), flush=True)


# --------------------------------------------------------------------------



def main(argv=None):
    p = argparse.ArgumentParser(
        description="PyTorch CPU reference for Tandem's MLP benchmark.")
    p.add_argument("--batch", type=positive_int_list, default=[100, 1000, 10000],
                   help="comma-separated batch sizes (default 100,1000,10000)")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="minimum timed seconds per (mode, batch) (default 3)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch.set_num_threads value (default 2)")
    p.add_argument("--mode", choices=["train", "infer", "both"], default="both")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per line")
    p.add_argument("--accuracy-epochs", type=int, default=0, metavar="N",
                   help="instead of timing, train N epochs with shuffled "
                        "batches and print per-epoch test accuracy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args(argv)
    if args.threads <= 0:
        p.error("--threads must be positive")

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if threads != args.threads:
        print("warning: asked for %d threads, torch uses %d"
              % (args.threads, threads), file=sys.stderr)

    if args.accuracy_epochs > 0:
        run_accuracy(args, threads)
    else:
        run_throughput(args, threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
