#!/usr/bin/env python3
"""The seed end to end ("Experiment with Dask and TensorFlow", M. Rocklin) with Tandem's engine.

What the blog post does with TensorFlow, done here with `tandem.dask` on a
distributed.LocalCluster and Fashion-MNIST (Debian's IDX files):

 1. images and labels as dask arrays from delayed loaders, the training split concatenated
    --copies times (20, like the seed's MNIST x 20), then persisted in the workers' memory;
 2. images[1], the mean image and the variance image, written as PNGs into --out;
 3. the arrays rechunked into blocks of --rows rows (10,000, like the seed) and turned into
    futures of (images, labels) pairs;
 4. Tandem started inside the Dask cluster (--ps 1 --workers 4 --scorer 1: one role per Dask
    worker process), with the validation rows handed to the scorer;
 5. the blocks fed to the Tandem workers `while cluster.training` (the seed's
    `while scores.data[-1] > 1000`), the scores printed as they come;
 6. the run stopped, the final model scored on the t10k split, and the Dask cluster checked to
    still run tasks.

Data types: pixels stay uint8 end to end (the engine scales uint8 pixels by 1/255 itself; float32
pixels would be used as they are), and labels are uint8 class ids. The engine also takes the
seed's one-hot float32 label rows (it reads the arg-max of each row), at 40 bytes a label instead
of one.

Validation: the last 5,000 rows of the training file are held out, as `tandem prepare` and the
engine do, once (not once per copy); the copies are made of the other rows.

The score is the seed's: the cross-entropy summed over the 5,000 validation rows. The default
target, 1750, is the engine's default (`tandem launch --target`). The servers run in sync mode
by default, as `tandem launch` does (the workers' gradients averaged per step); the seed's async
mode (--ps-mode async) stays near 3,000 with 4 workers at the seed's learning rate and would run
into --max-seconds instead.

usage: dask_seed.py [--copies 20] [--rows 10000] [--ps 1 --workers 4 --scorer 1]
                    [--target 1750] [--max-seconds 600] [--limit-rows N] [--out DIR]
Small: dask_seed.py --copies 1 --limit-rows 12000 --workers 2 --target 3000 --max-seconds 120
"""

import argparse
import gzip
import os
import struct
import sys
import threading
import time
import zlib

import numpy as np

VALIDATION_ROWS = 5000
T0 = time.monotonic()


def say(text):
    print(f"[{time.monotonic() - T0:7.1f} s] {text}", flush=True)


# --- Data: IDX files (gzipped or raw) -------------------------------------------------------

def idx_path(data_dir, name):
    for candidate in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")):
        if os.path.exists(candidate):
            return candidate
    raise FileNotFoundError(f"no {name} or {name}.gz in {data_dir}")


def read_idx(path):
    """An IDX file (MNIST's format) as a numpy array: uint8 data only, as MNIST's files are."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file")
    if data[2] != 0x08:
        raise ValueError(f"{path} holds IDX type 0x{data[2]:02x}; this reader takes uint8 (0x08)")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {array.size} values for dimensions {dims}")
    return array.reshape(dims)


def load_split(data_dir, prefix):
    images = read_idx(idx_path(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(idx_path(data_dir, f"{prefix}-labels-idx1-ubyte"))
    return images.reshape(len(images), -1), labels


def load_train(data_dir, rows):
    """The loader the seed's get_mnist() is: the training rows (all but the last 5,000)."""
    images, labels = load_split(data_dir, "train")
    return images[:rows].copy(), labels[:rows].copy()


def load_validation(data_dir):
    images, labels = load_split(data_dir, "train")
    return images[-VALIDATION_ROWS:].copy(), labels[-VALIDATION_ROWS:].copy()


def idx_shapes(data_dir):
    """Rows and pixels per image of the training file, from its header (read once, here)."""
    path = idx_path(data_dir, "train-images-idx3-ubyte")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        header = f.read(16)
    _, rows, height, width = struct.unpack(">4I", header)
    return rows, height * width


# --- Pictures -------------------------------------------------------------------------------

def to_gray8(image):
    image = np.asarray(image, dtype=np.float64)
    low, high = float(image.min()), float(image.max())
    scaled = (image - low) / (high - low) if high > low else np.zeros_like(image)
    return np.round(scaled * 255).astype(np.uint8)


def write_png(path, image, zoom=8):
    """A grayscale PNG, scaled to 0..255 and enlarged zoom x zoom (28 x 28 pixels are hard to
    see): matplotlib's imsave when it is there, else by hand."""
    image = np.kron(np.asarray(image, dtype=np.float64), np.ones((zoom, zoom)))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.imsave(path, np.asarray(image, dtype=np.float64), cmap="gray")
        return "matplotlib"
    except ImportError:
        return write_png_zlib(path, image)


def write_png_zlib(path, image):
    """A grayscale 8-bit PNG written by hand (zlib for the image data)."""
    gray = to_gray8(image)
    height, width = gray.shape

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    raw = b"".join(b"\x00" + gray[y].tobytes() for y in range(height))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))
    return "zlib"


# --- The run --------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the MNIST-format IDX files (gz or raw)")
    p.add_argument("--copies", type=int, default=20, help="copies of the training split (seed: 20)")
    p.add_argument("--limit-rows", type=int, default=0,
                   help="use only the first N training rows (0: all but the 5,000 validation rows)")
    p.add_argument("--rows", type=int, default=10000, help="rows per block fed to Tandem")
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--scorer", type=int, default=1)
    p.add_argument("--threads-per-worker", type=int, default=2,
                   help="threads of each Dask worker process")
    p.add_argument("--target", type=float, default=1750.0,
                   help="stop once the summed validation loss is below this (0: no target)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="safety limit on training")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--model", default="784-100-10")
    p.add_argument("--ps-mode", default="sync",
                   help="sync (the engine's default: the workers' gradients averaged per step), "
                        "async (the seed's: each applied as it comes; at lr 0.01 with 4 workers "
                        "its loss stays near 3,000, above the default target) or "
                        "bounded_staleness")
    p.add_argument("--min-accuracy", type=float, default=0.0,
                   help="fail when the test accuracy is below this")
    p.add_argument("--out", default="dask_seed_out", help="where the PNGs go")
    args = p.parse_args(argv)
    if args.copies < 1 or args.rows < 1 or args.limit_rows < 0:
        p.error("--copies and --rows must be positive, --limit-rows not negative")
    return args


def print_scores(cluster, stop):
    """The seed's `scores` channel: every score as it comes (newest 10 first, then each new)."""
    shown = 0
    try:
        for score in cluster.follow_scores():
            shown += 1
            say(f"score {shown:3d}: validation loss {score['loss']:9.1f}  "
                f"accuracy {score['accuracy']:.4f}  step {score['step']}")
            if stop.is_set():
                break
    except Exception as e:  # noqa: BLE001 - the stream's end is not the run's failure
        if not stop.is_set():
            say(f"(the scores stream ended: {e})")


def main(argv=None):
    args = parse_args(argv)
    import dask
    import dask.array as da
    from dask import delayed
    from distributed import Client, LocalCluster, wait

    import tandem
    import tandem.dask

    total_rows, pixels = idx_shapes(args.data)
    train_rows = total_rows - VALIDATION_ROWS
    if args.limit_rows:
        train_rows = min(train_rows, args.limit_rows)
    processes = args.ps + args.workers + args.scorer
    say(f"Dask LocalCluster: {processes} worker processes x {args.threads_per_worker} threads "
        f"(ps {args.ps} + workers {args.workers} + scorer {args.scorer})")
    with LocalCluster(n_workers=processes, threads_per_worker=args.threads_per_worker,
                      processes=True, dashboard_address=":0") as dask_cluster, \
            Client(dask_cluster) as client:
        say(f"Dask client {client.scheduler.address}, dashboard {client.dashboard_link}")

        # 1. The seed's data preparation: delayed loaders, from_delayed, concatenate, persist.
        datasets = [delayed(load_train)(args.data, train_rows) for _ in range(args.copies)]
        images = da.concatenate([da.from_delayed(d[0], shape=(train_rows, pixels), dtype=np.uint8)
                                 for d in datasets], axis=0)
        labels = da.concatenate([da.from_delayed(d[1], shape=(train_rows,), dtype=np.uint8)
                                 for d in datasets], axis=0)
        say(f"images {images!r}")
        say(f"labels {labels!r}  (uint8 class ids; pixels stay uint8, the engine scales them by 1/255)")
        images, labels = client.persist([images, labels])
        wait([images, labels])
        say(f"persisted {images.shape[0]:,} rows ({images.nbytes / 1e6:.0f} MB of pixels) "
            f"in the Dask workers' memory")

        # 2. A look at the data with ordinary dask.array operations.
        os.makedirs(args.out, exist_ok=True)
        side = int(round(pixels ** 0.5))
        pixels32 = images.astype(np.float32)  # float64 (numpy's default) is twice the work
        pictures = dask.compute(images[1], pixels32.mean(axis=0), pixels32.var(axis=0))
        for name, picture in zip(("image1", "mean", "variance"), pictures):
            picture = picture.reshape((side, side))
            path = os.path.join(args.out, f"{name}.png")
            how = write_png(path, picture)
            say(f"wrote {path} ({how}; values {picture.min():.1f} to {picture.max():.1f})")

        # 3. Blocks of --rows rows, as futures of (images, labels) pairs.
        images = images.rechunk((args.rows, pixels))
        labels = labels.rechunk((args.rows,))
        image_blocks = images.to_delayed().flatten().tolist()
        label_blocks = labels.to_delayed().flatten().tolist()
        batches = client.compute([delayed(tuple)([im, la])
                                  for im, la in zip(image_blocks, label_blocks)])
        wait(batches)
        say(f"{len(batches)} blocks of up to {args.rows:,} rows in the workers' memory")

        # Validation (held out once) and the test split for the final model.
        validation = delayed(load_validation, nout=2)(args.data)
        val_images = da.from_delayed(validation[0], shape=(VALIDATION_ROWS, pixels), dtype=np.uint8)
        val_labels = da.from_delayed(validation[1], shape=(VALIDATION_ROWS,), dtype=np.uint8)

        # 4. Tandem in the Dask cluster.
        started = time.monotonic()
        cluster, dask_spec = tandem.dask.start(
            client, ps=args.ps, worker=args.workers, scorer=args.scorer,
            validation=(val_images, val_labels), target=args.target,
            max_seconds=args.max_seconds, batch=args.batch, lr=args.lr, model=args.model,
            ps_mode=args.ps_mode)
        say(f"Tandem started in {time.monotonic() - started:.1f} s: {cluster!r}")
        say(f"tandem spec {cluster.as_dict()}")
        say(f"dask_spec {dask_spec}")
        stop_printing = threading.Event()
        printer = threading.Thread(target=print_scores, args=(cluster, stop_printing), daemon=True)
        printer.start()

        # 5. The seed's loop: feed every block again while training goes on.
        rounds = 0
        try:
            while cluster.training:
                tandem.dask.feed(batches, cluster)
                rounds += 1
                say(f"fed round {rounds}: {len(batches)} blocks")
        except BaseException:
            # The run is ended before the error goes on: the roles' tasks finish, and the scores
            # stream (in the printer thread) ends rather than being cut off at exit.
            stop_printing.set()
            try:
                tandem.dask.stop(cluster)
            except Exception as e:  # noqa: BLE001 - the feeding error is the one to report
                say(f"(stopping after the error: {type(e).__name__}: {e})")
            printer.join(timeout=5)
            raise

        # 6. Stop, score the final model on the test split, check the Dask cluster.
        result = tandem.dask.stop(cluster)
        stop_printing.set()
        printer.join(timeout=5)
        scores = [s["loss"] for s in result["scores"]]
        state = result["state"]["cluster"]
        say(f"stopped ({result['stop_reason']}) after {len(scores)} scores, "
            f"{state['batches_done']} batches, step {state['step']}; "
            f"last score {scores[-1] if scores else float('nan'):.1f}")
        for role in result["roles"]:
            extra = f", {role['rows_fed']:,} rows fed" if role["kind"] == "worker" else ""
            say(f"  {role['name']} on {role['dask_worker']}: {role['seconds']:.1f} s{extra}")
        test_images, test_labels = load_split(args.data, "t10k")
        test = result["model"].evaluate(test_images, test_labels)
        say(f"test accuracy on t10k: {test['accuracy']:.4f} (loss {test['loss_sum']:.1f} summed "
            f"over {test['samples']:,} images; model {result['model']!r})")
        check = client.submit(lambda pair: int(np.bincount(pair[1], minlength=10).max()),
                              batches[0], pure=False).result(timeout=60)
        say(f"the Dask cluster still runs tasks (the first block's commonest class: {check:,} rows)")

    failures = []
    if args.target > 0 and result["stop_reason"] != "target":
        failures.append(f"the target {args.target} was not reached (stop: {result['stop_reason']})")
    if test["accuracy"] < args.min_accuracy:
        failures.append(f"test accuracy {test['accuracy']:.4f} < {args.min_accuracy}")
    if failures:
        print("dask_seed: FAILED: " + "; ".join(failures), file=sys.stderr, flush=True)
        return 1
    say("dask_seed: OK")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any error is the example's failure, said plainly
        import traceback

        traceback.print_exc()
        print(f"dask_seed: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
