"""Checks `tandem inspect --json` against NumPy: reads the dataset store with zarr-python,
recomputes the per-column mean and variance (float64, population variance as np.var) of the
inspected split's images, and compares them, the overall min/max/mean, the label histogram and the
sample's label with what tandem printed.

usage: inspect_check.py STORE INSPECT_JSON          (INSPECT_JSON: the text, or @FILE)
exit status: 0 when everything agrees within rtol 1e-6, 1 when not, 77 (skip) when the installed
zarr-python cannot read the store's format (a v3 store needs zarr-python >= 3).
"""
import json
import os
import sys

import numpy as np
import zarr

RTOL = 1e-6
BLOCK_BYTES = 256 << 20  # rows are read in blocks of about this many float64 bytes


def fail(message):
    print("FAIL: " + message)
    return 1


def close(got, want, rtol=RTOL, scale=None):
    """|got - want| <= rtol * |want| (+ a tiny floor relative to `scale` for zeros)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    floor = 1e-12 * (np.max(np.abs(want)) if scale is None else scale)
    err = np.abs(got - want)
    ok = err <= rtol * np.abs(want) + floor
    rel = err / np.maximum(np.abs(want), floor if floor > 0 else 1e-300)
    return bool(np.all(ok)), float(np.max(rel)) if rel.size else 0.0


def column_mean_var(images):
    """NumPy float64 mean and var along axis 0, computed in row blocks (two passes, as np.var:
    the mean first, then the mean of squared deviations from it)."""
    rows = images.shape[0]
    features = int(np.prod(images.shape[1:]))
    block = max(1, BLOCK_BYTES // (8 * max(features, 1)))
    chunk_rows = images.chunks[0]
    block = max(chunk_rows, block // chunk_rows * chunk_rows)  # whole chunks per read
    total = np.zeros(features, dtype=np.float64)
    lo, hi = np.inf, -np.inf
    for start in range(0, rows, block):
        x = np.asarray(images[start:start + block]).reshape(-1, features).astype(np.float64)
        total += x.sum(axis=0)
        lo, hi = min(lo, x.min()), max(hi, x.max())
    mean = total / rows
    m2 = np.zeros(features, dtype=np.float64)
    for start in range(0, rows, block):
        x = np.asarray(images[start:start + block]).reshape(-1, features).astype(np.float64)
        m2 += ((x - mean) ** 2).sum(axis=0)
    return mean, m2 / rows, lo, hi


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    store, text = argv[1], argv[2]
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    report = json.loads(text)
    major = int(zarr.__version__.split(".")[0])
    if os.path.exists(os.path.join(store, "zarr.json")) and major < 3:
        print(f"SKIP: {store} is a Zarr v3 store and zarr-python {zarr.__version__} reads v2 only")
        return 77

    group = zarr.open_group(store, mode="r")
    split = report["split"]
    prefix = "" if split == "train" else split + "/"
    images = group[prefix + "images"]
    # A split may come without labels (images to classify): then tandem reports none.
    labels = group[prefix + "labels"] if prefix + "labels" in group else None
    failures = 0

    mean, var, lo, hi = column_mean_var(images)
    got_mean = np.array(report["column_mean"], dtype=np.float64)
    got_var = np.array(report["column_variance"], dtype=np.float64)
    if got_mean.shape != mean.shape or got_var.shape != var.shape:
        return fail(f"column statistics have {got_mean.size}/{got_var.size} values, expected "
                    f"{mean.size} (the features of {store}/{prefix}images)")
    ok, worst = close(got_mean, mean)
    print(f"column mean:     worst relative error {worst:.3g} over {mean.size} columns")
    if not ok:
        failures += fail(f"column means differ from NumPy by more than rtol {RTOL}")
    ok, worst = close(got_var, var, scale=float(np.max(var)) if var.size else 1.0)
    print(f"column variance: worst relative error {worst:.3g} over {var.size} columns")
    if not ok:
        failures += fail(f"column variances differ from NumPy by more than rtol {RTOL}")

    stats = report["arrays"][prefix + "images"]
    if stats["rows"] != images.shape[0]:
        failures += fail(f"rows {stats['rows']} != {images.shape[0]}")
    if stats["min"] != lo or stats["max"] != hi:
        failures += fail(f"min/max {stats['min']}/{stats['max']} != NumPy's {lo}/{hi}")
    ok, worst = close(stats["mean"], mean.mean())
    if not ok:
        failures += fail(f"overall mean {stats['mean']} != NumPy's {mean.mean()}")

    sample = report["sample"]
    if labels is None:
        if prefix + "labels" in report["arrays"] or sample["label"] is not None:
            failures += fail(f"{store} has no {prefix}labels, yet tandem reports some: "
                             f"{report['arrays'].get(prefix + 'labels')}, sample {sample}")
    else:
        values, counts = np.unique(np.asarray(labels[:]), return_counts=True)
        want_hist = {str(int(v)): int(c) for v, c in zip(values, counts)}
        if report["arrays"][prefix + "labels"]["histogram"] != want_hist:
            failures += fail(f"label histogram {report['arrays'][prefix + 'labels']['histogram']} "
                             f"!= NumPy's {want_hist}")
        if int(sample["label"]) != int(labels[sample["row"]]):
            failures += fail(f"sample label {sample['label']} != {int(labels[sample['row']])}")

    if failures:
        return 1
    no_labels = "" if labels is not None else ", no labels"
    print(f"ok: {store} {split} split ({images.shape[0]} rows x {mean.size} features, "
          f"{images.dtype}{no_labels}) agrees with NumPy float64 within rtol {RTOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
