#!/usr/bin/env python3
"""Zarr interoperability between Tandem and zarr-python / dask (run by zarr_interop_test.sh).

  zarr_interop.py versions
      prints the zarr, dask and numpy versions this Python sees, as JSON
  zarr_interop.py write DIR [--zarr-format N] [--blosc-cname NAME] [--deflate gzip|zlib]
                  [--deflate-level N] [--nonfinite-attributes]
      writes the known arrays into a group at DIR with dask.array.to_zarr and zarr's defaults
      (compressor, fill value, key separator), and a 0-d array with zarr itself; with
      --blosc-cname (zarr 2 only), dask's arrays with blosc using that compressor instead; with
      --deflate, numcodecs' GZip or Zlib in Zarr v2 and zarr's GzipCodec in v3, their default
      levels or --deflate-level (numcodecs takes -1, zlib's default, which Tandem does not
      write); with --nonfinite-attributes, attributes holding NaN and infinities on the group
      and every array (Python's json writes them as bare NaN, Infinity, -Infinity)
  zarr_interop.py write-sharded DIR [--index-location start|end] [--compressor gzip|zstd]
      zarr 3 only: the known arrays but the 0-d one, written by zarr itself in shards of 2 x the
      known chunks per dimension (Zarr v3's sharding_indexed codec), the known chunks inner ones
  zarr_interop.py check DIR TANDEM_DUMP [--format N]
      reads every known array at DIR with zarr-python and checks it bit-exactly against the
      known values, and against Tandem's reading of the same store (the JSON lines of
      `zarr_tool dump DIR`): shape, dtype and the FNV-1a 64 hash of the logical bytes

The known arrays mirror tests/zarr_tool.cpp: values are functions of the flat C-order index, the
shapes leave partial edge chunks, and f32_sparse has NaN in every chunk whose index sum is odd.
"""
import argparse
import json
import math
import sys

import numpy as np

# name: (dtype, shape, chunks)
KNOWN = {
    "u8": (np.uint8, (137, 129), (40, 32)),
    "i64": (np.int64, (1001,), (250,)),
    "f32": (np.float32, (5, 7, 9), (2, 3, 4)),
    "f32_sparse": (np.float32, (10, 6), (4, 3)),
    "scalar": (np.int64, (), ()),
}
WRITTEN_BY_DASK = ("u8", "i64", "f32", "f32_sparse")


def expected(name):
    """The logical contents of a known array (the same formulas as zarr_tool.cpp)."""
    dtype, shape, chunks = KNOWN[name]
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    if name == "u8":
        values = (i * 7 + 3) % 256
    elif name == "i64":
        values = (i * 2654435761) % 1000003 - 500000
    elif name == "f32":
        values = i.astype(np.float64) * 0.25 - 100.0
    elif name == "f32_sparse":
        values = (i.astype(np.float64) * 0.5).reshape(shape)
        rows, cols = np.indices(shape)
        values[(rows // chunks[0] + cols // chunks[1]) % 2 == 1] = np.nan
    else:
        values = np.full(n, 42)
    return np.asarray(values).astype(dtype).reshape(shape)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def zarr_major():
    import zarr

    return int(zarr.__version__.split(".")[0])


def import_dask_array():
    import dask.array as da

    return da


def versions():
    import zarr

    info = {"python": sys.version.split()[0], "zarr": zarr.__version__, "numpy": np.__version__}
    try:
        import_dask_array()
        import dask

        info["dask"] = dask.__version__
    except Exception as e:  # noqa: BLE001 - report, do not fail: `check` needs no dask
        info["dask"] = f"unavailable: {e}"
    print(json.dumps(info))


def write(store, zarr_format, blosc_cname=None, crc32c=False, deflate=None, deflate_level=None,
          nonfinite_attributes=False):
    """The known arrays with dask's and zarr's defaults: only shape, chunks (from the dask
    chunks) and, for f32_sparse, a NaN fill value are chosen (and blosc_cname if given; with
    crc32c, zarr 3's zstd followed by its crc32c checksum codec; deflate, gzip or zlib)."""
    import zarr

    da = import_dask_array()
    v3 = zarr_major() >= 3
    fmt = {} if zarr_format is None else {"zarr_format": zarr_format}
    if v3:
        zarr.open_group(store, mode="w", **fmt)
    else:
        if zarr_format not in (None, 2):
            sys.exit(f"zarr {zarr.__version__} writes Zarr v2 only")
        zarr.open_group(store, mode="w")
    if blosc_cname is not None:
        if v3:
            sys.exit("--blosc-cname is for zarr 2 (numcodecs' Blosc as the v2 compressor)")
        from numcodecs import Blosc
        fmt["compressor"] = Blosc(cname=blosc_cname, clevel=5, shuffle=Blosc.SHUFFLE)
    if crc32c:
        if not v3 or zarr_format == 2:
            sys.exit("--crc32c is for Zarr v3 (zarr 3's Crc32cCodec)")
        from zarr.codecs import Crc32cCodec, ZstdCodec
        fmt["compressors"] = [ZstdCodec(level=0), Crc32cCodec()]
    if deflate is not None:
        import numcodecs
        level = {} if deflate_level is None else {"level": deflate_level}
        v2_codec = numcodecs.GZip(**level) if deflate == "gzip" else numcodecs.Zlib(**level)
        if not v3:
            fmt["compressor"] = v2_codec
        elif zarr_format == 2:
            fmt["compressors"] = [v2_codec]
        elif deflate == "gzip":
            from zarr.codecs import GzipCodec
            fmt["compressors"] = [GzipCodec(**level)]
        else:
            sys.exit("--deflate zlib is for Zarr v2 (Zarr v3 has gzip)")
    for name in WRITTEN_BY_DASK:
        dtype, shape, chunks = KNOWN[name]
        x = da.from_array(expected(name), chunks=chunks)
        extra = {"fill_value": np.nan} if name == "f32_sparse" else {}
        da.to_zarr(x, f"{store}/{name}", **fmt, **extra)
    # dask has no 0-d chunks to store; zarr writes the 0-d array itself.
    if v3:
        z = zarr.create_array(f"{store}/scalar", shape=(), dtype="int64", **fmt)
    else:
        z = zarr.open_array(f"{store}/scalar", mode="w", shape=(), dtype="int64")
    z[...] = 42
    if nonfinite_attributes:
        group = zarr.open_group(store, mode="r+")
        group.attrs["stat"] = math.nan
        for name in KNOWN:
            group[name].attrs["range"] = [-math.inf, math.inf]


def write_sharded(store, index_location, compressor):
    """The known arrays in shards (zarr 3: create_array with a ShardingCodec serializer)."""
    import zarr
    from zarr.codecs import BytesCodec, GzipCodec, ShardingCodec, ZstdCodec

    if zarr_major() < 3:
        sys.exit("write-sharded needs zarr 3")
    zarr.open_group(store, mode="w")
    inner_compressor = GzipCodec() if compressor == "gzip" else ZstdCodec()
    for name in WRITTEN_BY_DASK:
        dtype, shape, chunks = KNOWN[name]
        fill = np.nan if name == "f32_sparse" else 0
        sharding = ShardingCodec(chunk_shape=chunks, codecs=[BytesCodec(), inner_compressor],
                                 index_location=index_location)
        z = zarr.create_array(f"{store}/{name}", shape=shape, dtype=dtype, fill_value=fill,
                              chunks=tuple(2 * c for c in chunks), serializer=sharding,
                              compressors=None)
        z[...] = expected(name)
    # The 0-d array as `write` makes it: sharding a 0-d array means nothing.
    zarr.create_array(f"{store}/scalar", shape=(), dtype="int64")[...] = 42


def open_format(z):
    """The Zarr format of an opened array, in zarr 2 and 3."""
    if hasattr(z, "metadata") and hasattr(z.metadata, "zarr_format"):
        return int(z.metadata.zarr_format)
    return 2


def describe(z):
    """What compressor zarr-python sees (for the log: which defaults were written)."""
    if zarr_major() >= 3:
        return str(z.compressors if z.metadata.zarr_format == 2 else z.metadata.codecs)
    return repr(z.compressor)


def tandem_group_attributes(store):
    """The root group's attributes as written, read without zarr-python."""
    for name in (".zattrs", "zarr.json"):
        try:
            with open(f"{store}/{name}", encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            continue
        return doc.get("attributes", {}) if name == "zarr.json" else doc
    return {}


def check(store, dump_path, expect_format):
    import zarr

    with open(dump_path, encoding="utf-8") as f:
        tandem = {line["name"]: line for line in map(json.loads, filter(str.strip, f))}
    problems = []
    # Tandem's group holds a non-ASCII attribute (zarr_tool write), which zarr 2.13 reads only
    # when escaped: it decodes .zattrs as ASCII.
    if "writer" in tandem_group_attributes(store) and \
            zarr.open_group(store, mode="r").attrs.get("note") != "Donn\u00e9es \u2713":
        problems.append(f"{store}: zarr {zarr.__version__} reads the group's note as "
                        f"{zarr.open_group(store, mode='r').attrs.get('note')!r}")
    if sorted(tandem) != sorted(KNOWN):
        problems.append(f"Tandem found arrays {sorted(tandem)}; expected {sorted(KNOWN)}")
    for name in KNOWN:
        where = f"{store}/{name}"
        z = zarr.open_array(where, mode="r")
        got = np.asarray(z[...])
        want = expected(name)
        # Bit-exact: bytes, so NaN payloads count and NaN == NaN.
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            problems.append(f"{where}: zarr {zarr.__version__} reads {got.dtype}{got.shape}, "
                            f"not the known {want.dtype}{want.shape} values bit-exactly")
            continue
        if expect_format is not None and open_format(z) != expect_format:
            problems.append(f"{where}: zarr sees format {open_format(z)}; expected {expect_format}")
        t = tandem.get(name)
        if t is None:
            continue
        digest = fnv1a64(got.astype(got.dtype.newbyteorder("<")).tobytes(order="C"))
        total = float(np.nansum(got.astype(np.float64)))
        mismatches = []
        if tuple(t["shape"]) != got.shape:
            mismatches.append(f"shape {t['shape']} vs {list(got.shape)}")
        if np.dtype(t["dtype"]) != got.dtype:
            mismatches.append(f"dtype {t['dtype']} vs {got.dtype}")
        if t["fnv1a64"] != digest:
            mismatches.append(f"hash {t['fnv1a64']} vs {digest}")
        if not math.isclose(t["sum"], total, rel_tol=1e-12, abs_tol=1e-9):
            mismatches.append(f"sum {t['sum']} vs {total}")
        if expect_format is not None and t["format"] != expect_format:
            mismatches.append(f"format {t['format']} vs expected {expect_format}")
        # Sharded: zarr calls the inner chunks `chunks` and the shards `shards`.
        shards = getattr(z, "shards", None)
        if shards is not None or "inner_chunks" in t:
            tandem_inner = tuple(t.get("inner_chunks", ()))
            if shards is None or tandem_inner != tuple(z.chunks) or tuple(t["chunks"]) != shards:
                mismatches.append(f"Tandem sees shards {t['chunks']} of {tandem_inner}; zarr "
                                  f"shards {shards} of {z.chunks}")
        if mismatches:
            problems.append(f"{where}: Tandem and zarr {zarr.__version__} disagree: " +
                            "; ".join(mismatches))
        else:
            print(f"  {name}: format {t['format']}, {t['compressor']} (zarr sees {describe(z)}), "
                  f"{t['missing_chunks']} missing chunks read as fill: identical")
    for p in problems:
        print(f"MISMATCH {p}", file=sys.stderr)
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("versions")
    w = sub.add_parser("write")
    w.add_argument("store")
    w.add_argument("--zarr-format", type=int, choices=(2, 3))
    w.add_argument("--blosc-cname")
    w.add_argument("--crc32c", action="store_true")
    w.add_argument("--deflate", choices=("gzip", "zlib"))
    w.add_argument("--deflate-level", type=int)
    w.add_argument("--nonfinite-attributes", action="store_true")
    ws = sub.add_parser("write-sharded")
    ws.add_argument("store")
    ws.add_argument("--index-location", choices=("start", "end"), default="end")
    ws.add_argument("--compressor", choices=("gzip", "zstd"), default="zstd")
    c = sub.add_parser("check")
    c.add_argument("store")
    c.add_argument("tandem_dump")
    c.add_argument("--format", type=int, choices=(2, 3))
    args = parser.parse_args()
    if args.command == "versions":
        versions()
        return 0
    if args.command == "write-sharded":
        write_sharded(args.store, args.index_location, args.compressor)
        return 0
    if args.command == "write":
        write(args.store, args.zarr_format, args.blosc_cname, args.crc32c, args.deflate,
              args.deflate_level, args.nonfinite_attributes)
        return 0
    return check(args.store, args.tandem_dump, args.format)


if __name__ == "__main__":
    sys.exit(main())
