"""tandem.dask.predict with out=: a dask array's blocks predicted on a real distributed.LocalCluster
of worker processes and written as the Zarr group `tandem predict` writes, read back with
zarr-python; resumed after a lost chunk and a killed write's temporary file; a rerun on changed
rows refused; bad output refused.

usage: dask_predict_test.py TANDEM (the tandem binary, to compare with `tandem predict`)
"""

import filecmp
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import dask.array as da  # noqa: E402
import zarr  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import tandem  # noqa: E402
import tandem.dask as tdask  # noqa: E402
from tandem import _dask_parallel  # noqa: E402
from synthetic_rows import make_rows  # noqa: E402

TANDEM = None  # set from the command line


def chunk_files(out):
    """Every chunk file of a predictions group, relative to it (metadata files left out)."""
    found = []
    for array in ("classes", "probabilities"):
        for root, _, files in os.walk(os.path.join(out, array)):
            found += [os.path.relpath(os.path.join(root, f), out) for f in files
                      if not f.startswith(".z") and f != "zarr.json"]
    return sorted(found)


def bits(a):
    """float32 values as their bit patterns: equality is bit-exactness."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


class DaskPredictTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                   dashboard_address=None)
        cls.client = Client(cls.cluster)
        cls.model, _ = tandem.train(make_rows(2000, 21), layers=[784, 16, 10], epochs=1,
                                    batch=100, backend="cpu", threads=1)
        cls.images, cls.labels = make_rows(2500, 22)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def dask_images(self, chunks=(700, 14, 28)):
        # 700-row blocks, each row split across two blocks: the last row chunk (400) is an edge.
        return da.from_array(self.images.reshape(2500, 28, 28), chunks=chunks)

    def test_output_is_model_predict_and_what_tandem_predict_writes(self):
        classes, probabilities = self.model.predict(self.images, probabilities=True)
        np.testing.assert_array_equal(classes, self.model.predict(self.images))
        self.assertTrue((probabilities.argmax(axis=1) == classes).all())
        # What each task computes: one 700-row block on one thread. The classes are the same
        # bits whatever the blocks and threads; the logits' last bits are not (OpenBLAS sums in
        # an order that depends on the matrix's size and the threads), so the probabilities
        # equal the whole array's only to within rounding.
        per_block = np.concatenate([
            self.model.predict(self.images[i:i + 700], threads=1, probabilities=True)[1]
            for i in range(0, 2500, 700)])
        np.testing.assert_allclose(per_block, probabilities, rtol=0, atol=1e-6)
        model_path = os.path.join(self.dir, "m.safetensors")
        self.model.save(model_path)
        for zarr_format in (3, 2):
            with self.subTest(zarr_format=zarr_format):
                out = os.path.join(self.dir, f"dask{zarr_format}.zarr")
                s = tdask.predict(self.model, self.dask_images(), out, labels=self.labels,
                                  zarr_format=zarr_format)
                self.assertEqual((s["rows"], s["chunks"], s["chunks_written"], s["chunks_skipped"],
                                  s["rows_predicted"]), (2500, 4, 4, 0, 2500))
                self.assertEqual(s["correct"], int((classes == self.labels).sum()))
                self.assertAlmostEqual(s["accuracy"], float((classes == self.labels).mean()))
                g = zarr.open_group(out, mode="r")
                c, p = g["classes"], g["probabilities"]
                self.assertEqual((c.dtype, c.shape, c.chunks), (np.uint8, (2500,), (700,)))
                self.assertEqual((p.dtype, p.shape, p.chunks),
                                 (np.float32, (2500, 10), (700, 10)))
                np.testing.assert_array_equal(c[:], classes)
                np.testing.assert_array_equal(bits(p[:]), bits(per_block))
                self.assertEqual(g.attrs["created_by"], "tandem.dask.predict")
                # tandem predict on a store of the same rows (written by zarr-python, chunked
                # the same), on one thread as each task, writes the same metadata and chunk
                # files, byte for byte.
                store = os.path.join(self.dir, f"store{zarr_format}.zarr")
                sg = zarr.open_group(store, mode="w", zarr_format=zarr_format)
                sg.create_array("images", data=self.images, chunks=(700, 784))
                sg.create_array("labels", data=self.labels, chunks=(700,))
                cli_out = os.path.join(self.dir, f"cli{zarr_format}.zarr")
                subprocess.run([TANDEM, "predict", "--model", model_path, "--data", store,
                                "--split", "train", "--out", cli_out, "--backend", "cpu",
                                "--threads", "1"], check=True, capture_output=True)
                files = chunk_files(out)
                self.assertEqual(len(files), 8)  # 4 chunks of each array
                self.assertEqual(files, chunk_files(cli_out))
                meta = ["zarr.json"] if zarr_format == 3 else [".zarray"]
                for array in ("classes", "probabilities"):
                    files += [os.path.join(array, m) for m in meta]
                _, mismatch, errors = filecmp.cmpfiles(out, cli_out, files, shallow=False)
                self.assertEqual((mismatch, errors), ([], []))

    def test_rerun_writes_only_missing_chunks_and_never_reads_a_temporary_file(self):
        out = os.path.join(self.dir, "pred.zarr")
        first = tdask.predict(self.model, self.dask_images(), out)
        self.assertEqual((first["chunks_written"], first["chunks_skipped"]), (4, 0))
        files = chunk_files(out)
        contents = {}
        for f in files:
            with open(os.path.join(out, f), "rb") as g:
                contents[f] = g.read()
        mtimes = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in files}
        # Chunk 1 lost its classes file; chunk 3 was being written when its run was killed:
        # neither file renamed into place, a partial temporary file of its probabilities left
        # (garbage of the full size, so only its name tells it is not a chunk).
        os.remove(os.path.join(out, "classes/c/1"))
        os.remove(os.path.join(out, "classes/c/3"))
        os.remove(os.path.join(out, "probabilities/c/3/0"))
        stray = os.path.join(out, "probabilities/c/3/0.tmp-4242-4243")
        with open(stray, "wb") as f:
            f.write(b"\xff" * (700 * 10 * 4))
        again = tdask.predict(self.model, self.dask_images(), out, labels=self.labels)
        self.assertEqual((again["chunks_written"], again["chunks_skipped"],
                          again["rows_predicted"]), (2, 2, 700 + 400))
        self.assertFalse(os.path.exists(stray), "the killed run's temporary file is left")
        self.assertEqual(chunk_files(out), files)
        for f in files:
            with open(os.path.join(out, f), "rb") as g:
                self.assertEqual(g.read(), contents[f], f)
        untouched = ["classes/c/0", "classes/c/2", "probabilities/c/0/0", "probabilities/c/2/0"]
        for f in untouched:
            self.assertEqual(os.stat(os.path.join(out, f)).st_mtime_ns, mtimes[f],
                             f"{f} was rewritten")
        np.testing.assert_array_equal(zarr.open_group(out, mode="r")["classes"][:],
                                      self.model.predict(self.images))
        # Nothing left to do: every chunk skipped, no task run.
        done = tdask.predict(self.model, self.dask_images(), out)
        self.assertEqual((done["chunks_written"], done["chunks_skipped"]), (0, 4))

    def test_a_rerun_compares_every_done_chunks_rows(self):
        out = os.path.join(self.dir, "pred.zarr")
        tdask.predict(self.model, self.dask_images(), out)
        # Each chunk's rows are recorded as a SHA-256 zarr-python reads: the digest of the
        # 700-row block (whole rows) the chunk was predicted from.
        recorded = zarr.open_group(out, mode="r")["input_sha256"][:]
        self.assertEqual(recorded.shape, (4, 32))
        rows = self.images.reshape(2500, 28, 28)
        for c in range(4):
            block = rows[c * 700:(c + 1) * 700]
            self.assertEqual(recorded[c].tobytes(), _dask_parallel._block_digest(block), c)
        files = chunk_files(out)
        mtimes = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in files}
        # One byte changed in a middle block (neither the first nor the last): refused, naming
        # the chunk, with chunk 3 missing and nothing written.
        changed = rows.copy()
        changed[1000, 5, 5] ^= 1
        os.remove(os.path.join(out, "classes/c/3"))
        with self.assertRaises(tandem.InputError) as e:
            tdask.predict(self.model, da.from_array(changed, chunks=(700, 14, 28)), out)
        for text in (out, "written from another model or input", "chunk(s) 1 ", "overwrite=True"):
            self.assertIn(text, str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(out, "classes/c/3")), "chunk 3 was written")
        for f in files:
            if f != "classes/c/3":
                self.assertEqual(os.stat(os.path.join(out, f)).st_mtime_ns, mtimes[f], f)
        # The same rows again: the missing chunk written, the others compared and kept.
        s = tdask.predict(self.model, self.dask_images(), out)
        self.assertEqual((s["chunks_written"], s["chunks_skipped"]), (1, 3))
        np.testing.assert_array_equal(zarr.open_group(out, mode="r")["classes"][:],
                                      self.model.predict(self.images))

    def test_a_row_without_finite_pixels_is_refused_naming_it(self):
        # Row 1500 (chunk 2 of 700-row chunks) holds a NaN pixel: it has no arg-max, and was
        # written as class 0 with NaN probabilities.
        out = os.path.join(self.dir, "pred.zarr")
        images = (self.images / np.float32(255)).astype(np.float32).reshape(2500, 28, 28)
        images[1500, 3, 3] = np.nan
        with self.assertRaisesRegex(tandem.InputError, "row 1500 holds a pixel that is not finite"):
            tdask.predict(self.model, da.from_array(images, chunks=(700, 28, 28)), out)
        # Raised once every task had ended: the other chunks are all written, none is left
        # being written under the caller.
        self.assertEqual(sorted(os.listdir(os.path.join(out, "classes/c"))), ["0", "1", "3"])
        # Lazily too, the array's row is named (it was counted within its block, 100, and the
        # block's first, 1400, named beside it).
        lazy = tdask.predict(self.model, da.from_array(images, chunks=(700, 28, 28)))
        with self.assertRaisesRegex(tandem.InputError,
                                    r"^images: row 1500 of the array holds a pixel that is not "
                                    "finite"):
            lazy.compute()

    def test_irregular_blocks_are_written_in_regular_chunks(self):
        out = os.path.join(self.dir, "pred.zarr")
        images = da.concatenate([self.dask_images()[:300], self.dask_images()[300:]])
        self.assertEqual(images.chunks[0], (300, 400, 700, 700, 400))
        s = tdask.predict(self.model, images, out)
        self.assertEqual((s["chunks"], s["chunks_written"]), (4, 4))
        c = zarr.open_group(out, mode="r")["classes"]
        self.assertEqual(c.chunks, (700,))
        np.testing.assert_array_equal(c[:], self.model.predict(self.images))

    def test_a_block_of_no_rows_predicts_nothing(self):
        # A block of no rows (boolean filtering makes them) once failed to reshape(0, -1).
        images = da.from_array(self.images.reshape(2500, 28, 28), chunks=(700, 28, 28))
        keep = np.ones(2500, bool)
        keep[:700] = False  # the whole first block filtered out
        images = images[da.from_array(keep, chunks=700)].compute_chunk_sizes()
        self.assertEqual(images.chunks[0], (0, 700, 700, 400))
        np.testing.assert_array_equal(tdask.predict(self.model, images).compute(),
                                      self.model.predict(self.images[700:]))

    def test_bad_output_and_input_refused(self):
        out = os.path.join(self.dir, "pred.zarr")
        tdask.predict(self.model, self.dask_images(), out)
        # Another chunking of the same rows: refused, naming the store and both layouts.
        with self.assertRaises(tandem.InputError) as e:
            tdask.predict(self.model, self.dask_images(chunks=(500, 28, 28)), out)
        message = str(e.exception)
        for text in (out, "2500 rows in chunks of 700", "chunks of 500", "overwrite=True"):
            self.assertIn(text, message)
        # Other data of the same shape, chunking and dtype (another data set, or the rows in
        # another order): refused, where a rerun once took it for the same input.
        with self.assertRaisesRegex(tandem.InputError, "written from another model or input"):
            tdask.predict(self.model, self.dask_images()[::-1], out)
        changed = self.images.reshape(2500, 28, 28).copy()
        changed[-1, 0, 0] ^= 1  # one byte, in the last block
        with self.assertRaisesRegex(tandem.InputError, "written from another model or input"):
            tdask.predict(self.model, da.from_array(changed, chunks=(700, 14, 28)), out)
        # Another model: refused too.
        other, _ = tandem.train(make_rows(500, 5), layers=[784, 16, 10], epochs=1, batch=100,
                                backend="cpu", threads=1, seed=3)
        with self.assertRaisesRegex(tandem.InputError, "written from another model or input"):
            tdask.predict(other, self.dask_images(), out)
        # A task of an earlier run that starts late, after another run took the group over, names
        # its run's output id and writes nothing.
        layout = (3, 2500, 700, 10, _dask_parallel._fingerprint(self.model, self.dask_images()))
        with self.assertRaisesRegex(tandem.Error, "taken over by another run"):
            _dask_parallel._predict_chunk_to(self.images[:700], 0, self.model, out, layout, 1,
                                             "an-earlier-run")
        # One prediction at a time writes out, from Dask or tandem predict (OUT.lock beside it).
        with tandem._tandem._OutputLock(out):
            with self.assertRaisesRegex(tandem.InputError,
                                        f"out {out} is in use by another run \\(process \\d+\\)"):
                tdask.predict(self.model, self.dask_images(chunks=(500, 28, 28)), out,
                              overwrite=True)
        # overwrite=True starts afresh with the new chunking.
        s = tdask.predict(self.model, self.dask_images(chunks=(500, 28, 28)), out, overwrite=True)
        self.assertEqual((s["chunks"], s["chunks_written"], s["chunks_skipped"]), (5, 5, 0))
        self.assertEqual(zarr.open_group(out, mode="r")["classes"].chunks, (500,))
        # A directory that is not a predictions group is never written to nor removed.
        elsewhere = os.path.join(self.dir, "data")
        os.makedirs(elsewhere)
        open(os.path.join(elsewhere, "keep.txt"), "w").close()
        for overwrite in (False, True):
            with self.assertRaisesRegex(tandem.InputError, "holds something other"):
                tdask.predict(self.model, self.dask_images(), elsewhere, overwrite=overwrite)
        self.assertEqual(os.listdir(elsewhere), ["keep.txt"])
        # ... and no lock file of the refused runs is left beside it (tandem predict's too).
        self.assertFalse(os.path.exists(elsewhere + ".lock"))
        with self.assertRaisesRegex(tandem.InputError, r"one entry per row of images \(2500\)"):
            tdask.predict(self.model, self.dask_images(), out, labels=self.labels[:10])
        # Labels that name no class (unlabelled rows as -1, 1-based ids, 3.5) are refused, not
        # counted as wrong predictions.
        for bad, said in ((-1, "label -1 at row 7"), (10, "label 10 at row 7"),
                          (3.5, "label 3.5 at row 7")):
            labels = self.labels.astype(np.float64)
            labels[7] = bad
            with self.assertRaisesRegex(tandem.InputError, said + " names no class"):
                tdask.predict(self.model, self.dask_images(), out, labels=labels)
        # Read in place (uint8 class ids), an id past the model's classes is refused too; one-hot
        # rows by the engine's rule.
        labels = self.labels.astype(np.uint8)
        labels[9] = 10
        with self.assertRaisesRegex(tandem.InputError, "label 10 at row 9 names no class"):
            tdask.predict(self.model, self.dask_images(), out, labels=labels)
        with self.assertRaisesRegex(tandem.InputError, "labels must be class ids"):
            tdask.predict(self.model, self.dask_images(), out, labels=self.labels.astype(str))
        one_hot = np.eye(10, dtype=np.float32)[self.labels]
        one_hot[5] = 0
        with self.assertRaisesRegex(tandem.InputError, "one-hot label row 5 names no class"):
            tdask.predict(self.model, self.dask_images(), out, labels=one_hot)
        with self.assertRaisesRegex(tandem.InputError, "takes 784 features per row"):
            tdask.predict(self.model, da.zeros((100, 10), chunks=50), out)
        with self.assertRaisesRegex(tandem.InputError, "zarr_format must be 2 or 3"):
            tdask.predict(self.model, self.dask_images(), os.path.join(self.dir, "x"),
                          zarr_format=4)
        # Rows of unknown count per chunk (boolean filtering): out needs them up front.
        filtered = self.dask_images()[da.from_array(self.labels, chunks=700) < 5]
        with self.assertRaisesRegex(tandem.InputError, "unknown length .*compute_chunk_sizes"):
            tdask.predict(self.model, filtered, os.path.join(self.dir, "x"))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "x")))
        # What only out uses is refused without it, not ignored.
        for given, kwargs in (("labels", {"labels": self.labels}),
                              ("overwrite", {"overwrite": True}),
                              ("zarr_format", {"zarr_format": 2})):
            with self.assertRaisesRegex(tandem.InputError,
                                        f"^{given}: for predictions written to out"):
                tdask.predict(self.model, self.dask_images(), **kwargs)


if __name__ == "__main__":
    TANDEM = sys.argv.pop(1)
    unittest.main(verbosity=2)
