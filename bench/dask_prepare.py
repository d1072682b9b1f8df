"""The seed's data preparation in Dask, for comparison with `tandem prepare`: Fashion-MNIST's
55,000 training images (the first 55,000 rows, the training split `tandem prepare` keeps; the
seed's TensorFlow reader holds out the first 5,000 instead), concatenated
COPIES times, rechunked to CHUNK rows, written with dask.array.to_zarr (uncompressed, Zarr v3
with zarr 3, the format Tandem writes by default). Validation and test splits are left out; the
training split is all but 1% of the bytes.

usage: dask_prepare.py OUT COPIES [CHUNK]
"""
import gzip
import sys
import time

import dask
import dask.array as da
import numpy as np
import zarr


def read_idx(path, header):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


def main():
    out, copies = sys.argv[1], int(sys.argv[2])
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 10000
    start = time.perf_counter()
    base = "/usr/share/datasets/fashion-mnist/"
    images = read_idx(base + "train-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:55000]
    labels = read_idx(base + "train-labels-idx1-ubyte.gz", 8)[:55000]
    read = time.perf_counter() - start
    x = da.concatenate([da.from_array(images, chunks=(chunk, 784))] * copies).rechunk((chunk, 784))
    y = da.concatenate([da.from_array(labels, chunks=chunk)] * copies).rechunk(chunk)
    root = zarr.open_group(out, mode="w")
    kwargs = {"compressors": None} if zarr.__version__ >= "3" else {"compressor": None}
    with dask.config.set(scheduler="threads"):
        da.to_zarr(x, root.create_array("images", shape=x.shape, chunks=(chunk, 784), dtype="u1", **kwargs))
        da.to_zarr(y, root.create_array("labels", shape=y.shape, chunks=(chunk,), dtype="u1", **kwargs))
    total = time.perf_counter() - start
    print(f"dask {dask.__version__} zarr {zarr.__version__}: {x.shape[0]} rows in {total:.2f} s "
          f"(source read {read:.2f} s)")


if __name__ == "__main__":
    main()
