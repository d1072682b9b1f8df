"""The Python package without Dask: models, training, checkpoints, the roles on native threads,
feeding without copies, the scores channel, and errors carrying the engine's messages."""

import gc
import math
import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tandem  # noqa: E402
from synthetic_rows import make_rows  # noqa: E402


class ModelTest(unittest.TestCase):
    def test_train_evaluate_predict_save_load(self):
        x, y = make_rows(3000, 1)
        xv, yv = make_rows(500, 2)
        epochs = []
        model, summary = tandem.train((x, y), validation=(xv, yv), layers=[784, 32, 10], epochs=3,
                                      batch=100, backend="cpu", threads=1, on_epoch=epochs.append)
        self.assertEqual([e["epoch"] for e in epochs], [1, 2, 3])
        self.assertEqual(summary["steps"], 90)
        result = model.evaluate(xv, yv)
        self.assertGreater(result["accuracy"], 0.95)
        self.assertAlmostEqual(result["loss_sum"], summary["validation"]["loss_sum"], places=3)
        predicted = model.predict(xv)
        self.assertEqual(predicted.dtype, np.uint8)
        self.assertEqual(int((predicted == yv).sum()), result["correct"])
        # float32 pixels in [0, 1] are what uint8 pixels become inside the engine.
        as_float = model.evaluate((xv / np.float32(255)).astype(np.float32), yv)
        self.assertAlmostEqual(as_float["loss_sum"], result["loss_sum"], delta=1e-3 * result["loss_sum"] + 1e-3)
        # A row with a NaN pixel has no arg-max: refused naming it, not predicted as class 0.
        with_nan = (xv[:10] / np.float32(255)).astype(np.float32)
        with_nan[6, 100] = np.nan
        for probabilities in (False, True):
            with self.assertRaisesRegex(tandem.InputError,
                                        "row 6 holds a pixel that is not finite"):
                model.predict(with_nan, probabilities=probabilities)
        # Nor scored: evaluate names the row too (its NaN loss once read as a diverged model's).
        with self.assertRaisesRegex(tandem.InputError,
                                    "row 6 holds a pixel that is not finite .*no loss can be "
                                    "scored on it"):
            model.evaluate(with_nan, yv[:10])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            model.save(path)
            loaded = tandem.load(path)
            self.assertEqual(loaded.layers, [784, 32, 10])
            for name, value in model.parameters().items():
                np.testing.assert_array_equal(loaded.parameters()[name], value)
            # Parameters alone: a run starts from them (init=, the optimizer afresh); resuming
            # them, which went on with SGD whatever had trained them, is refused.
            kw = dict(layers=[784, 32, 10], batch=100, backend="cpu", threads=1)
            again, _ = tandem.train((x, y), epochs=0, init=path, **kw)
            for name, value in model.parameters().items():
                np.testing.assert_array_equal(again.parameters()[name], value)
            further, _ = tandem.train((x, y), validation=(xv, yv), epochs=1, init=path, **kw)
            self.assertGreater(further.evaluate(xv, yv)["accuracy"], 0.95)
            with open(path, "rb") as f:
                with self.assertRaisesRegex(tandem.InputError, "holds parameters only.*init="):
                    tandem.train((x, y), epochs=1, resume=f.read(), **kw)
            with self.assertRaisesRegex(tandem.InputError, "not both"):
                tandem.train((x, y), epochs=1, init=path, resume=b"x", **kw)
            # A training state's bytes given to init= (they read as a path cut at their first
            # NUL: "cannot open '") are said to go to resume=.
            with open(path, "rb") as f:
                with self.assertRaisesRegex(TypeError, "init takes the path of a checkpoint "
                                            "file; .* resume="):
                    tandem.train((x, y), epochs=1, init=f.read(), **kw)
            path_bytes, _ = tandem.train((x, y), epochs=0, init=os.fsencode(path), **kw)
            self.assertEqual(path_bytes.layers, [784, 32, 10])  # a path as bytes is a path

    def test_a_resumed_run_takes_the_states_settings(self):
        # resume=state goes on as the state's run would have, its settings with it (tandem train
        # --resume does the same): given only the epochs, it once trained on at the defaults
        # (batch 1000, learning rate 0.01, seed 1) whatever the state's run had used.
        x, y = make_rows(600, 11)
        xv, yv = make_rows(200, 12)
        same = dict(backend="cpu", threads=1)
        kw = dict(layers=[784, 24, 10], batch=50, learning_rate=0.003, seed=7, **same)
        whole, _ = tandem.train((x, y), validation=(xv, yv), epochs=2, **kw)
        _, _, state = tandem.train((x, y), validation=(xv, yv), epochs=1, return_state=True,
                                   **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing given differs: nothing said
            resumed, summary = tandem.train((x, y), validation=(xv, yv), epochs=2, resume=state,
                                            **same)
        self.assertEqual(summary["steps"], 600 // 50)  # one epoch, at the state's batch
        for name, value in whole.parameters().items():
            np.testing.assert_array_equal(resumed.parameters()[name], value)
        with self.assertWarnsRegex(UserWarning, "resuming with batch=100; the state's run used "
                                   "50"):
            tandem.train((x, y), epochs=2, resume=state, batch=100, **same)
        with self.assertWarnsRegex(UserWarning, "resuming with learning_rate=0.01; the state's "
                                   "run used 0.003"):
            tandem.train((x, y), epochs=2, resume=state, learning_rate=0.01, **same)
        # keep_best too: a run that kept its last epoch, resumed, kept the best (the default).
        kept_last, _ = tandem.train((x, y), validation=(xv, yv), epochs=3, keep_best=False,
                                    **kw)
        _, _, last_state = tandem.train((x, y), validation=(xv, yv), epochs=1, keep_best=False,
                                        return_state=True, **kw)
        with tempfile.TemporaryDirectory() as d:  # the state says what its run kept
            pathlib.Path(d, "s.safetensors").write_bytes(last_state)
            from safetensors import safe_open
            with safe_open(str(pathlib.Path(d, "s.safetensors")), "np") as f:
                self.assertEqual(f.metadata()["keep"], "last")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            resumed, summary = tandem.train((x, y), validation=(xv, yv), epochs=3,
                                            resume=last_state, **same)
        self.assertEqual(summary["kept_epoch"], 3, summary)
        for name, value in kept_last.parameters().items():
            np.testing.assert_array_equal(resumed.parameters()[name], value)
        with self.assertWarnsRegex(UserWarning, "resuming with keep_best=True; the state's run "
                                   "used False"):
            tandem.train((x, y), validation=(xv, yv), epochs=2, resume=last_state,
                         keep_best=True, **same)
        with self.assertRaisesRegex(tandem.InputError, "checkpoint holds model 784-24-10, this "
                                    "run asks for 784-100-10"):
            tandem.train((x, y), epochs=2, resume=state, layers=[784, 100, 10], **same)

    def test_parameters_round_trip_and_seeded_init(self):
        a = tandem.Model.initialized([784, 16, 10], seed=7)
        b = tandem.Model.initialized([784, 16, 10], seed=7)
        c = tandem.Model([784, 16, 10])
        for name, value in a.parameters().items():
            np.testing.assert_array_equal(value, b.parameters()[name])
        c.set_parameters(a.parameters())
        np.testing.assert_array_equal(c.parameters()["hid_w"], a.parameters()["hid_w"])
        copy = pickle.loads(pickle.dumps(a))  # how a model travels to Dask workers
        self.assertEqual(copy.layers, [784, 16, 10])
        for name, value in a.parameters().items():
            np.testing.assert_array_equal(copy.parameters()[name], value)
        with self.assertRaisesRegex(tandem.InputError, "no parameter 'nope'"):
            c.set_parameters({"nope": np.zeros(3, np.float32)})

    def test_a_bound_class_made_with_new_alone_is_refused_not_a_crash(self):
        # pybind11 2.10 ran methods on the unconstructed object: tandem.Model.__new__(Model)
        # .parameters() crashed the interpreter. Run apart, so a crash fails this test alone.
        script = textwrap.dedent("""
            import tandem
            from tandem import _tandem
            classes = [c for c in vars(_tandem).values()
                       if isinstance(c, type) and not issubclass(c, BaseException)]
            assert len(classes) >= 10, classes
            for cls in classes:
                try:
                    cls.__new__(cls)
                except TypeError as e:
                    assert "__new__ alone" in str(e), e
                else:
                    raise AssertionError(cls.__name__ + ".__new__ made an object")
            try:
                tandem.Role.__new__(tandem.WorkerRole)  # through the base's __new__
            except TypeError as e:
                assert "WorkerRole.__new__ alone" in str(e), e
            else:
                raise AssertionError("Role.__new__(WorkerRole) made an object")
            sub = type("Sub", (tandem.Model,), {})([784, 5, 10])  # a subclass still made
            assert sub.layers == [784, 5, 10]
            print("refused", len(classes))
            """)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("refused", done.stdout)

    def test_a_label_past_the_models_classes_is_named_with_its_split_and_row(self):
        # It once said only "data has 11 classes, model 784-100-10 has 10 outputs".
        x, y = make_rows(300, 4)
        bad = y.copy()
        bad[37] = 10
        said = "data has 11 classes, model 784-16-10 has 10 outputs \\(label 10 at row 37 names"
        kw = dict(layers=[784, 16, 10], epochs=1, backend="cpu", threads=1)
        with self.assertRaisesRegex(tandem.InputError, "^the training split: " + said):
            tandem.train((x, bad), **kw)
        with self.assertRaisesRegex(tandem.InputError, "^the validation split: " + said):
            tandem.train((x, y), validation=(x, bad), **kw)
        with self.assertRaisesRegex(tandem.InputError, "^the test split: " + said):
            tandem.train((x, y), test=(x, bad), **kw)
        with self.assertRaisesRegex(tandem.InputError, "^" + said):
            tandem.Model.initialized([784, 16, 10]).evaluate(x, bad)

    def test_training_that_diverges_raises_as_tandem_train_exits_1(self):
        """NaN parameters are no model, and their state no resume: tandem.train once returned
        them as if it had trained. Judged as `tandem train` judges: the kept parameters'
        validation loss, else the test split's, else the last epoch's training loss."""
        x, y = make_rows(300, 14)
        kw = dict(layers=[784, 8, 10], epochs=2, batch=100, backend="cpu", threads=1)
        with self.assertRaisesRegex(tandem.InputError, "training diverged: the last epoch's "
                                    "training loss is -?nan.*lower learning_rate"):
            tandem.train((x, y), learning_rate=1e30, return_state=True, **kw)
        with self.assertRaisesRegex(tandem.InputError, "training diverged: the parameters give "
                                    "a test loss of"):
            tandem.train((x, y), test=(x, y), learning_rate=1e30, **kw)
        with self.assertRaisesRegex(tandem.InputError, "training diverged: the kept parameters "
                                    "give a validation loss of"):
            tandem.train((x, y), validation=(x, y), learning_rate=1e30, **kw)
        # A NaN pixel (which diverged the run) is refused before training, naming its row.
        with_nan = (x / np.float32(255)).astype(np.float32)
        with_nan[5, 7] = np.nan
        with self.assertRaisesRegex(tandem.InputError, "the training split: row 5 holds a pixel "
                                    "that is not finite"):
            tandem.train((with_nan, y), validation=(x, y), **kw)
        # A run that trains well reports its last epoch's training loss, finite.
        _, summary = tandem.train((x, y), **kw)
        self.assertTrue(0 < summary["train_loss_mean"] < 10, summary)

    def test_paths_pairs_and_parameters_as_users_give_them(self):
        with tempfile.TemporaryDirectory() as d:
            # pathlib paths, as for any file API; (images, labels) as a list or a tuple.
            x, y = make_rows(300, 4)
            model, _ = tandem.train([x, y], validation=[x, y], layers=[784, 8, 10], epochs=1,
                                    batch=100, backend="cpu", threads=1)
            # Without a validation or test split there is no evaluation to report: None, not
            # a loss of 0 over 0 rows.
            reports = []
            _, unscored = tandem.train([x, y], layers=[784, 8, 10], epochs=2, batch=100,
                                       backend="cpu", threads=1, on_epoch=reports.append)
            self.assertEqual([(r["epoch"], r["validation"]) for r in reports],
                             [(1, None), (2, None)])
            self.assertIsNone(unscored["validation"])
            self.assertIsNone(unscored["test"])
            path = pathlib.Path(d) / "model.safetensors"
            model.save(path)
            np.testing.assert_array_equal(tandem.load(path).parameters()["hid_b"],
                                          model.parameters()["hid_b"])
            self.assertTrue(tandem.keygen(pathlib.Path(d) / "pair"))
            self.assertTrue(os.path.exists(os.path.join(d, "pair.key_secret")))
            # A refused set_parameters changes nothing (the good entry before the bad one
            # included).
            before = model.parameters()
            with self.assertRaisesRegex(tandem.InputError, "'sm_w' has the wrong shape"):
                model.set_parameters({"hid_b": np.ones(8, np.float32),
                                      "sm_w": np.ones((2, 2), np.float32)})
            np.testing.assert_array_equal(model.parameters()["hid_b"], before["hid_b"])
            # What tandem.load refuses is not set (it was, and then save refused it, predict
            # blamed a diverged run): a NaN or an infinity.
            with self.assertRaisesRegex(tandem.InputError, "parameter 'hid_b' holds a value "
                                        "that is not finite \\(inf at flat index 1\\)"):
                model.set_parameters({"hid_b": np.array([1, np.inf] + [0] * 6, np.float32)})
            np.testing.assert_array_equal(model.parameters()["hid_b"], before["hid_b"])

    def test_bad_input_names_the_problem(self):
        model = tandem.Model()
        x, y = make_rows(10, 3)
        with self.assertRaisesRegex(TypeError, "not int64"):
            model.evaluate(x.astype(np.int64), y)
        with self.assertRaisesRegex(ValueError, "one entry per row of images"):
            model.evaluate(x, y[:5])
        # No rows: its zeros read as a perfect loss (tandem eval refuses an empty split too).
        with self.assertRaisesRegex(tandem.InputError, "evaluate: no rows to score"):
            model.evaluate(x[:0], y[:0])
        # An engine InputError is a ValueError and a tandem.Error, with the engine's message.
        with self.assertRaises(tandem.InputError) as caught:
            model.evaluate(x[:, :100], y)
        self.assertIsInstance(caught.exception, ValueError)
        self.assertIsInstance(caught.exception, tandem.Error)
        self.assertIn("100 features per row", str(caught.exception))
        for call in (lambda: model.evaluate(x, y, threads=-1),
                     lambda: model.predict(x, threads=-1)):
            with self.assertRaisesRegex(tandem.InputError, "threads must be >= 0, got -1"):
                call()
        with self.assertRaisesRegex(tandem.InputError, "unknown run setting 'bacth'"):
            tandem.Coordinator({"fed": True, "bacth": 10})
        # NaN, which JSON cannot spell, is refused naming its key (it failed as a parse error).
        with self.assertRaisesRegex(tandem.InputError, "'lr' must be a finite number, got nan"):
            tandem.Coordinator({"fed": True, "lr": float("nan")})
        with self.assertRaisesRegex(tandem.InputError, "'lr' must be a finite number, got inf"):
            tandem.Coordinator({"fed": True, "lr": np.float32("inf")})
        with self.assertRaisesRegex(tandem.InputError, "NaN and infinity are not values"):
            tandem.Coordinator({"fed": True, "model": {"nested": float("nan")}})
        # A fixed control port: the scores channel takes a port of its own beside it (it was
        # bound to the same address: "Address already in use").
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        fixed = tandem.Coordinator({"fed": True}, bind=f"tcp://127.0.0.1:{port}")
        try:
            self.assertEqual(fixed.endpoint, f"tcp://127.0.0.1:{port}")
            self.assertTrue(fixed.scores_endpoint.startswith("tcp://127.0.0.1:"))
            self.assertNotEqual(fixed.scores_endpoint, fixed.endpoint)
        finally:
            fixed.close()
        # A tcp:// port past 65535 (ZeroMQ served 99999 on 34463).
        with self.assertRaisesRegex(tandem.InputError, "needs a port from 0 to 65535"):
            tandem.Coordinator({"fed": True}, bind="tcp://127.0.0.1:99999")
        # Time limits without a "no end": 0 or negative failed the run at once, or lost every
        # role at every tick.
        with self.assertRaisesRegex(tandem.InputError,
                                    "startup_timeout_s must be a number of seconds above 0"):
            tandem.Coordinator({"fed": True}, startup_timeout_s=0)
        with self.assertRaisesRegex(tandem.InputError, "heartbeat_timeout_s must be"):
            tandem.Coordinator({"fed": True}, heartbeat_timeout_s=-1)
        # The roles heartbeat every 0.5 s: a shorter timeout lost live roles at every tick.
        with self.assertRaisesRegex(tandem.InputError, "heartbeat_timeout_s must be at least 1"):
            tandem.Coordinator({"fed": True}, heartbeat_timeout_s=0.5)
        with self.assertRaisesRegex(tandem.InputError, "coordinator_lost_s must be"):
            tandem.WorkerRole("tcp://127.0.0.1:1", coordinator_lost_s=0)
        # The same bound as scores(lost_after_s=) and `tandem scores --lost-after`.
        with self.assertRaisesRegex(tandem.InputError,
                                    "coordinator_lost_s must be above 0 and at most 86400"):
            tandem.WorkerRole("tcp://127.0.0.1:1", coordinator_lost_s=1e6)
        with self.assertRaisesRegex(tandem.InputError, "cannot be NaN"):
            tandem.scores("tcp://127.0.0.1:1", follow=False, timeout_s=float("nan"))
        with self.assertRaisesRegex(tandem.InputError, "timeout_s must be >= 0 with follow=False"):
            tandem.scores("tcp://127.0.0.1:1", follow=False, timeout_s=-1)
        with self.assertRaises(tandem.Error):
            tandem.load("/nonexistent/model.safetensors")
        # Class ids as whole floats, or in one column, read as the store reads them; a float
        # that is no whole class id is refused naming it. A one-hot row with a NaN or no
        # positive entry names no class.
        self.assertEqual(model.evaluate(x, y.astype(np.float64)), model.evaluate(x, y))
        self.assertEqual(model.evaluate(x, y.reshape(-1, 1).astype(np.float32)),
                         model.evaluate(x, y))
        self.assertEqual(model.evaluate(x, y.reshape(-1, 1)), model.evaluate(x, y))
        spoiled = y.astype(np.float64)
        spoiled[3] = 2.5
        with self.assertRaisesRegex(ValueError, "label 2.5 at row 3 names no class .class ids "
                                    "are whole numbers from 0 to 255"):
            model.evaluate(x, spoiled)
        with self.assertRaisesRegex(ValueError, "need 2 to 256 columns"):
            model.evaluate(x, np.zeros((len(y), 0), np.float32))
        self.assertEqual(model.evaluate(x, np.eye(10, dtype=np.int8)[y]), model.evaluate(x, y))
        one_hot = np.eye(10, dtype=np.float32)[y]
        one_hot[4] = 0
        with self.assertRaisesRegex(ValueError, "row 4 names no class"):
            model.evaluate(x, one_hot)
        one_hot[4, 2] = np.nan
        with self.assertRaisesRegex(ValueError, "row 4 names no class .it holds NaN"):
            model.evaluate(x, one_hot)

    def test_big_endian_pixels_are_read_as_numbers_not_bytes(self):
        # '>f4' has float32's type number; read in place its bytes came out reversed.
        model = tandem.Model.initialized([784, 16, 10], seed=3)
        x, y = make_rows(50, 4)
        native = (x / np.float32(255)).astype(np.float32)
        swapped = native.astype(">f4")
        self.assertEqual(model.evaluate(swapped, y), model.evaluate(native, y))
        np.testing.assert_array_equal(model.predict(swapped), model.predict(native))

    def test_ctrl_c_ends_training_that_has_no_epoch_callback(self):
        # Without on_epoch the training loop never took the GIL, so Ctrl-C waited for the whole
        # run. This run would take hours; if Ctrl-C is not heard, the watchdog fails the test.
        x, y = make_rows(2000, 5)
        heard = threading.Event()

        def watchdog():
            if not heard.wait(120):
                print("FAIL: Ctrl-C did not end tandem.train within 120 s", flush=True)
                os._exit(1)

        guard = threading.Thread(target=watchdog, daemon=True)
        guard.start()
        ctrl_c = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        with self.assertRaises(KeyboardInterrupt):
            tandem.train((x, y), layers=[784, 16, 10], epochs=1000000, batch=100, backend="cpu",
                         threads=1)
        heard.set()
        ctrl_c.join()
        guard.join()


    def test_ctrl_c_ends_a_long_prediction(self):
        # Model.predict looks at Ctrl-C between two blocks of 8,192 rows: interrupted early, it
        # ends long before the whole prediction would (it went on to the last row, then raised).
        # Compared with the same prediction's own time, measured here, not with a fixed bound.
        x, _ = make_rows(131072, 8)
        model = tandem.Model.initialized([784, 1024, 10], seed=2)
        started = time.monotonic()
        whole = model.predict(x, threads=1)
        whole_s = time.monotonic() - started
        ctrl_c = threading.Timer(whole_s / 8, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        ctrl_c.start()
        with self.assertRaises(KeyboardInterrupt):
            model.predict(x, threads=1)
        interrupted_s = time.monotonic() - started
        ctrl_c.join()
        self.assertLess(interrupted_s, whole_s / 2, (interrupted_s, whole_s))
        np.testing.assert_array_equal(model.predict(x[:9000], threads=1), whole[:9000])


class GilTest(unittest.TestCase):
    def test_long_model_calls_let_other_threads_run(self):
        """Initialising, saving and loading a large model, and building, resuming and returning
        a trainer's state, take seconds: other Python threads run meanwhile (they stalled, the
        GIL held throughout). Counted, not timed: a thread that ticks while the call runs."""
        ticks = [0]
        stop = threading.Event()

        def ticker():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.0005)

        layers = [784, 5000, 5000, 10]  # 29 M parameters
        x, y = make_rows(50, 6)

        def ticks_during(call):
            before = ticks[0]
            result = call()
            return ticks[0] - before, result

        thread = threading.Thread(target=ticker, daemon=True)
        thread.start()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "big.safetensors")
                counted, model = ticks_during(lambda: tandem.Model.initialized(layers, 3))
                self.assertGreater(counted, 3, "Model.initialized")
                counted, _ = ticks_during(lambda: model.save(path))
                self.assertGreater(counted, 3, "Model.save")
                counted, _ = ticks_during(lambda: tandem.load(path))
                self.assertGreater(counted, 3, "tandem.load")
            counted, (_, _, state) = ticks_during(lambda: tandem.train(
                (x, y), layers=layers, epochs=0, batch=50, backend="cpu", threads=1,
                return_state=True))
            self.assertGreater(counted, 3, "tandem.train building the trainer and its state")
            counted, _ = ticks_during(lambda: tandem.train(
                (x, y), layers=layers, epochs=0, batch=50, backend="cpu", threads=1,
                resume=state))
            self.assertGreater(counted, 3, "tandem.train resuming")
        finally:
            stop.set()
            thread.join()


class BlasKernelsTest(unittest.TestCase):
    # The import switches OpenBLAS from kernels older than AVX2 (its choice on a CPU model newer
    # than the library) to the best family kernels the CPU runs, as the tandem binary does; a
    # user's OPENBLAS_CORETYPE stands, without a warning. In fresh interpreters: the kernels are
    # chosen once per process.
    def kernels_of_a_fresh_import(self, **env):
        environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        environ.update(env)
        done = subprocess.run([sys.executable, "-W", "error", "-c",
                               "import tandem; print(*tandem._tandem._blas_kernels(), sep='|')"],
                              env=environ, capture_output=True, text=True, timeout=60)
        self.assertEqual((done.returncode, done.stderr), (0, ""))
        return done.stdout.strip().split("|")

    def test_the_import_runs_the_best_kernels_this_cpu_runs(self):
        loaded, better = self.kernels_of_a_fresh_import()
        self.assertNotEqual(loaded, "")
        self.assertEqual(better, "", f"the import left OpenBLAS on its {loaded} kernels")

    def test_openblas_coretype_stands(self):
        loaded, _ = self.kernels_of_a_fresh_import(OPENBLAS_CORETYPE="Prescott")
        self.assertEqual(loaded, "Prescott")

    def test_openblas_loaded_by_another_library_first_is_left_alone(self):
        # As Debian's numpy or torch would: the same libopenblas.so.0, loaded before tandem. Its
        # kernels are not switched under the other library's calls; where they are the old
        # ones, a warning says what to set. The other library loads the old kernels on purpose
        # (OPENBLAS_CORETYPE at its load, unset before tandem looks), so that on every CPU
        # there is something tandem could wrongly switch; the kernels are read before and after.
        script = ("import ctypes, os, warnings\n"
                  "lib = ctypes.CDLL('libopenblas.so.0')\n"
                  "lib.openblas_get_corename.restype = ctypes.c_char_p\n"
                  "before = lib.openblas_get_corename().decode()\n"
                  "del os.environ['OPENBLAS_CORETYPE']\n"
                  "with warnings.catch_warnings(record=True) as w:\n"
                  "    warnings.simplefilter('always')\n"
                  "    import tandem\n"
                  "after = lib.openblas_get_corename().decode()\n"
                  "print(before, after, tandem._tandem._blas_kernels()[1], sep='|')\n"
                  "print(*[str(x.message) for x in w], sep='\\n')\n")
        environ = dict(os.environ, OPENBLAS_CORETYPE="Prescott")
        done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        kernels, *warned = done.stdout.strip().split("\n")
        before, after, better = kernels.split("|")
        self.assertEqual(before, "Prescott")
        self.assertEqual(after, before, "tandem switched the kernels of the library loaded first")
        if better:  # the old kernels stayed: said, with what to set
            self.assertEqual(len(warned), 1, warned)
            self.assertIn(f"set OPENBLAS_CORETYPE={better} before starting Python", warned[0])
        else:
            self.assertEqual(warned, [])


class CoordinatorWaitTest(unittest.TestCase):
    def test_waits_end_at_their_timeout_or_when_closed(self):
        coordinator = tandem.Coordinator({"fed": True}, ps=1, workers=1, scorers=0,
                                         max_seconds=60)
        self.addCleanup(coordinator.close)
        start = time.monotonic()
        self.assertEqual(coordinator.wait_for("training", 0.3), "starting")
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        # No end (negative or infinite; infinite once overflowed into an instant return, and
        # negative returned at once): the wait goes on until another thread closes the
        # coordinator, which the wait survives (it held the coordinator) and reports.
        for no_end in (-1, math.inf):
            other = tandem.Coordinator({"fed": True}, ps=1, workers=1, scorers=0, max_seconds=60)
            closer = threading.Timer(0.5, other.close)
            closer.start()
            start = time.monotonic()
            with self.assertRaisesRegex(tandem.Error, "closed while waiting"):
                other.wait_for("done", no_end)
            self.assertGreaterEqual(time.monotonic() - start, 0.4)
            closer.join()
        with self.assertRaisesRegex(ValueError, "NaN"):
            coordinator.wait_for("training", math.nan)


class PullModelInterruptTest(unittest.TestCase):
    def test_ctrl_c_is_heard_while_pull_model_waits_for_a_silent_server(self):
        # The pull waited out the whole request timeout (60 s here) before Ctrl-C was raised.
        coordinator = tandem.Coordinator({"fed": True, "ps_timeout_ms": 60000}, ps=1, workers=1,
                                         scorers=0, max_seconds=120)
        self.addCleanup(coordinator.close)
        server = subprocess.Popen(
            [sys.executable, "-c", "import sys, tandem\n"
             "role = tandem.ParameterServerRole(sys.argv[1])\nrole.start()\nrole.join()",
             coordinator.endpoint])

        def end_server():
            server.send_signal(signal.SIGCONT)
            server.kill()
            server.wait(30)
        self.addCleanup(end_server)
        deadline = time.monotonic() + 60
        while True:  # until the server answers (None: the chief has not initialised it)
            try:
                self.assertIsNone(coordinator.pull_model())
                break
            except tandem.Error as e:
                self.assertIn("no parameter server is serving", str(e))
                self.assertLess(time.monotonic(), deadline, "the server never served")
                time.sleep(0.1)
        server.send_signal(signal.SIGSTOP)
        interrupt = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        interrupt.start()
        with self.assertRaises(KeyboardInterrupt):
            coordinator.pull_model()
        interrupt.join()
        self.assertLess(time.monotonic() - start, 10)


def start_fed_cluster(test, workers=1, target=0.0, role_args=None, before_start=None,
                      **settings):
    settings = dict({"fed": True, "batch": 100, "model": "784-32-10", "score_interval_s": 0.1,
                     "worker_threads": 1, "scorer_threads": 1}, **settings)
    coordinator = tandem.Coordinator(settings, ps=1, workers=workers, scorers=1, target=target,
                                     max_seconds=120)
    test.addCleanup(coordinator.close)
    xv, yv = make_rows(500, 99)
    role_args = role_args or {}
    roles = [tandem.ParameterServerRole(coordinator.endpoint, **role_args)]
    roles += [tandem.WorkerRole(coordinator.endpoint, **role_args) for _ in range(workers)]
    roles.append(tandem.ScorerRole(coordinator.endpoint, validation=(xv, yv), **role_args))
    if before_start:
        before_start(roles)
    for role in roles:
        role.start()
    test.assertEqual(coordinator.wait_for("training", 30), "training")
    return coordinator, roles, (xv, yv)


def end_cluster(test, coordinator, roles):
    if coordinator.phase == "training":
        coordinator.request_stop("test over")
    test.assertTrue(coordinator.wait_workers_gone(30))
    model = coordinator.pull_model()
    coordinator.finish()
    # The servers are leaving: said at once, not after a request timeout.
    with test.assertRaisesRegex(tandem.Error, r"pull_model\(\) before finish\(\)"):
        coordinator.pull_model()
    test.assertTrue(coordinator.wait_servers_gone(30))
    for role in roles:
        test.assertTrue(role.join(30))
        test.assertFalse(role.running)
    with test.assertRaisesRegex(tandem.Error, "a role runs once"):
        roles[0].start()  # joined, so its thread is no longer joinable: still refused
    return model


def write_zarr_store(path, images, labels):
    """A store as zarr-python writes one (images and labels, no splits): a run's data."""
    import zarr
    group = zarr.open_group(path, mode="w")
    group.create_array("images", data=images)
    group.create_array("labels", data=labels.astype(np.uint8))
    return path


class RolesTest(unittest.TestCase):
    def test_a_scorer_given_labels_past_the_models_classes_says_whose_rows(self):
        # Ids up to 255 pass the role's constructor; the model's 10 classes are known once the
        # scorer joins the run, where it fails naming itself and the rows (a worker's error
        # names its fed block).
        coordinator = tandem.Coordinator(dict(fed=True, batch=100, model="784-8-10"), ps=1,
                                         workers=1, scorers=1, max_seconds=60)
        self.addCleanup(coordinator.close)
        x, y = make_rows(50, 7)
        # No rows at all are refused at once: scored, they gave a loss of 0 (any target met).
        with self.assertRaisesRegex(tandem.InputError, "validation: no rows"):
            tandem.ScorerRole(coordinator.endpoint, validation=(x[:0], y[:0]))
        roles = [tandem.ParameterServerRole(coordinator.endpoint),
                 tandem.WorkerRole(coordinator.endpoint),
                 tandem.ScorerRole(coordinator.endpoint, validation=(x, y + 12))]
        for role in roles:
            role.start()
        with self.assertRaisesRegex(tandem.InputError, "^scorer0: the validation rows it "
                                    "scores: data has 22 classes, model 784-8-10 has 10"):
            roles[2].join(30)
        coordinator.fail("test over")
        # A failed run's other roles end with its error (a role's own process, or a batch
        # system's task, must not report success).
        for role in roles[:2]:
            with self.assertRaisesRegex(tandem.Error, "the run failed: test over"):
                role.join(30)

    def test_feeding_a_worker_of_a_run_on_its_store_says_it_is_not_trained_on(self):
        # A run on a store hands its workers the store's batches: what is fed to one was
        # taken and never trained on (then the full queue timed out). The feed says why.
        x, y = make_rows(300, 3)
        with tempfile.TemporaryDirectory() as tmp:
            store = write_zarr_store(os.path.join(tmp, "s.zarr"), x, y)
            # A model of another width than the store's rows: refused here, as by
            # tandem launch (every worker once failed on its first batch).
            with self.assertRaisesRegex(tandem.InputError,
                                        "its rows have 784 features, the model 20-16-10"):
                tandem.Coordinator(dict(data=store, batch=100, model="20-16-10"), ps=1,
                                   workers=1, scorers=0, max_seconds=60)
            coordinator = tandem.Coordinator(dict(data=store, batch=100, model="784-16-10"),
                                             ps=1, workers=1, scorers=0, max_seconds=60)
            roles = [tandem.ParameterServerRole(coordinator.endpoint),
                     tandem.WorkerRole(coordinator.endpoint, capacity=1)]
            for role in roles:
                role.start()
            try:
                with self.assertRaisesRegex(tandem.Error, "trains on the run's data store"):
                    for _ in range(3):  # the first may be queued before the worker joins
                        roles[1].feed(x, y, timeout_s=30)
            finally:
                coordinator.fail("test over")
                for role in roles:
                    with self.assertRaises(tandem.Error):
                        role.join(30)
                coordinator.close()

    def test_a_run_on_a_store_resumes_from_its_checkpoints_only_when_asked(self):
        # The servers start from the checkpoints in checkpoint_dir; resume=True has the epochs
        # go on after those the checkpoints come after, and without it such a directory is
        # refused (the servers took the checkpoints while the epochs counted from the first).
        x, y = make_rows(300, 3)
        with tempfile.TemporaryDirectory() as tmp:
            store = write_zarr_store(os.path.join(tmp, "s.zarr"), x, y)
            checkpoints = os.path.join(tmp, "checkpoints")
            settings = dict(data=store, batch=100, model="784-16-10", checkpoint_dir=checkpoints)

            def run(max_epochs, resume):
                coordinator = tandem.Coordinator(settings, ps=1, workers=1, scorers=0,
                                                 max_epochs=max_epochs, resume=resume)
                self.addCleanup(coordinator.close)
                roles = [tandem.ParameterServerRole(coordinator.endpoint),
                         tandem.WorkerRole(coordinator.endpoint)]
                for role in roles:
                    role.start()
                self.assertEqual(coordinator.wait_for("draining", 60), "draining")
                self.assertTrue(coordinator.wait_workers_gone(60))
                self.assertEqual(coordinator.stop_reason, "max-epochs")
                state = coordinator.state()["cluster"]
                coordinator.finish()
                for role in roles:
                    self.assertTrue(role.join(30))
                return coordinator, state

            with self.assertRaisesRegex(tandem.InputError, "^resume=True: no parameter server "
                                        "checkpoint in " + re.escape(checkpoints)):
                tandem.Coordinator(settings, ps=1, workers=1, scorers=0, max_epochs=1,
                                   resume=True)
            first, state = run(1, False)
            self.assertEqual((first.resumed_epochs, state["epoch"], state["batches_done"]),
                             (0, 1, 3))
            with self.assertRaisesRegex(tandem.InputError, "holds parameter server checkpoints"
                                        ".*resume=True continues that run"):
                tandem.Coordinator(settings, ps=1, workers=1, scorers=0, max_epochs=3)
            resumed, state = run(3, True)
            # Epochs 2 and 3 only: three batches each.
            self.assertEqual((resumed.resumed_epochs, state["epoch"], state["batches_done"]),
                             (1, 3, 6))
            # A fed run has no epochs to go on with: its servers start from the checkpoints,
            # asked or not.
            fed = tandem.Coordinator(dict(fed=True, batch=100, model="784-16-10",
                                          checkpoint_dir=checkpoints), ps=1, workers=1,
                                     scorers=0, max_seconds=60)
            self.assertEqual(fed.resumed_epochs, 0)
            fed.close()

    def test_servers_no_worker_initialised_hold_no_model(self):
        # A run stopped before its chief worker's Init (right after start()): its servers hold
        # no parameters, and pull_model says so with None (it raised "not initialised yet",
        # which failed tandem.dask.stop).
        coordinator = tandem.Coordinator(dict(batch=100, model="784-8-10", fed=True), ps=1,
                                         workers=1, scorers=0, max_seconds=60)
        self.addCleanup(coordinator.close)
        server = tandem.ParameterServerRole(coordinator.endpoint)
        server.start()
        deadline = time.monotonic() + 30
        while not coordinator.spec()["ps"] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(len(coordinator.spec()["ps"]), 1)
        self.assertIsNone(coordinator.pull_model())
        coordinator.fail("test over")
        with self.assertRaisesRegex(tandem.Error, "ps0: the run failed: test over"):
            server.join(30)

    def test_fed_training_reaches_the_target(self):
        coordinator, roles, (xv, yv) = start_fed_cluster(self, workers=2, target=25.0)
        workers = roles[1:3]
        blocks = [make_rows(1000, seed) for seed in range(6)]
        deadline = time.monotonic() + 90
        while coordinator.phase == "training" and time.monotonic() < deadline:
            for i, (x, y) in enumerate(blocks):
                try:
                    workers[i % 2].feed(x, y, timeout_s=5)
                except tandem.Error:
                    break  # the worker stopped: training is over
            coordinator.wait_for("draining", 0.2)
        self.assertEqual(coordinator.stop_reason, "target")
        scores = coordinator.scores()
        self.assertLess(scores[-1]["loss"], 25.0)
        model = end_cluster(self, coordinator, roles)
        # Every block fed before the stop was trained on or dropped; what the workers trained is
        # what they reported (their goodbye carries their last count).
        batches = coordinator.state()["cluster"]["batches_done"]
        self.assertGreater(batches, 0)
        self.assertLessEqual(batches, sum(w.rows_fed for w in workers) // 100)
        # The servers' final parameters are at least as good as the score that met the target
        # was, give or take the few steps after it.
        self.assertLess(model.evaluate(xv, yv)["loss_sum"], 4 * 25.0)
        # After the stop a worker's queue is closed: feeding says so.
        with self.assertRaisesRegex(tandem.Error, "training is over"):
            workers[0].feed(*blocks[0])

    def test_feeding_reads_arrays_in_place(self):
        coordinator, roles, _ = start_fed_cluster(self)
        worker = roles[1]
        x, y = make_rows(300, 5)
        before = sys.getrefcount(x)
        info = worker.feed(x, y)
        self.assertEqual(info["rows"], 300)
        self.assertFalse(info["pixels_copied"])
        self.assertFalse(info["labels_copied"])
        self.assertEqual(info["pixels_address"], x.ctypes.data)
        # The engine holds the array until it has trained on it, then lets go.
        deadline = time.monotonic() + 30
        while sys.getrefcount(x) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(sys.getrefcount(x), before)
        self.assertEqual(worker.rows_fed, 300)
        # A view with strides, float64 pixels and one-hot labels are converted once, and said so.
        info = worker.feed(x[::2], y[::2])
        self.assertTrue(info["pixels_copied"])
        info = worker.feed(x.astype(np.float64) / 255, np.eye(10, dtype=np.float32)[y])
        self.assertTrue(info["pixels_copied"])
        self.assertTrue(info["labels_copied"])
        info = worker.feed(x.reshape(300, 28, 28), y.astype(np.int64))
        self.assertFalse(info["pixels_copied"])
        self.assertTrue(info["labels_copied"])
        # float32 pixels at an address that is no multiple of 4 (a buffer taken at an offset, as
        # one received from elsewhere) are copied to one that is.
        raw = np.zeros(300 * 784 * 4 + 1, dtype=np.uint8)
        odd = np.frombuffer(raw.data, dtype=np.float32, count=300 * 784, offset=1).reshape(300, 784)
        odd[...] = x / np.float32(255)
        self.assertFalse(odd.flags.aligned)
        info = worker.feed(odd, y)
        self.assertTrue(info["pixels_copied"])
        self.assertEqual(info["pixels_address"] % 4, 0)
        end_cluster(self, coordinator, roles)

    def test_a_worker_error_surfaces_with_the_engine_message(self):
        x, y = make_rows(100, 6)
        y[37] = 12  # the model has 10 classes
        # Fed before the worker starts, the block is queued unchecked (the worker does not know
        # its model yet; once it does, such a block is refused to its feeder) and fails the
        # worker when trained on. Fed after the start, which of the two happened was timing.
        coordinator, roles, _ = start_fed_cluster(self, before_start=lambda r: r[1].feed(x, y))
        worker = roles[1]
        with self.assertRaisesRegex(tandem.InputError, "label 12 at row 37"):
            worker.join(30)
        with self.assertRaisesRegex(tandem.Error, "stopped on an error"):
            worker.feed(*make_rows(10, 7))
        coordinator.request_stop("test over")
        self.assertTrue(coordinator.wait_workers_gone(30))
        coordinator.finish()
        self.assertTrue(coordinator.wait_servers_gone(30))
        for role in (roles[0], roles[2]):
            self.assertTrue(role.join(30))

    def test_scores_channel_history_and_end(self):
        # NumPy scalars, as a grid of hyperparameters gives them, are the numbers they hold.
        coordinator, roles, _ = start_fed_cluster(self, batch=np.int64(100),
                                                  score_interval_s=np.float32(0.1))
        # The scorer scores new parameters only: blocks are fed until there are 12 scores.
        deadline = time.monotonic() + 60
        seed = 300
        while len(coordinator.scores()) < 12 and time.monotonic() < deadline:
            roles[1].feed(*make_rows(200, seed), timeout_s=5)
            seed += 1
            time.sleep(0.05)
        self.assertGreaterEqual(len(coordinator.scores()), 12)
        history = list(tandem.scores(coordinator.endpoint, follow=False, timeout_s=0.3))
        seqs = [s["seq"] for s in history]
        self.assertGreaterEqual(len(seqs), 10)
        self.assertEqual(seqs, sorted(set(seqs)))  # in order, no duplicates
        with self.assertRaisesRegex(ValueError, "lost_after_s must be above 0"):
            tandem.scores(coordinator.endpoint, lost_after_s=0)
        stream = tandem.scores(coordinator.endpoint, follow=True, timeout_s=30, lost_after_s=5)
        first = next(stream)
        self.assertIn("loss", first)
        # One reader at a time: another thread's next() is refused while one waits in it (two
        # reading its socket at once crashed the process). On a stream of its own, whose reader
        # has read the replayed history and waits for a new score when it is asked.
        shared = tandem.scores(coordinator.endpoint, follow=True, timeout_s=5)
        inside = threading.Event()
        def read_on():
            while True:
                inside.set()
                try:
                    next(shared)
                except (StopIteration, TimeoutError):
                    return
                except RuntimeError:
                    pass  # the main thread was in next() first: read on
                finally:
                    inside.clear()
        reader = threading.Thread(target=read_on, daemon=True)
        reader.start()
        refused, deadline = 0, time.monotonic() + 20
        while not refused and time.monotonic() < deadline:
            time.sleep(0.05)  # the history read: the reader waits in next()
            if not inside.is_set():
                continue
            try:
                next(shared)
            except RuntimeError as e:
                self.assertIn("being read by another thread", str(e))
                refused += 1
            except TimeoutError:
                continue  # this thread was in first, and no score came: try again
            except StopIteration:
                break
        self.assertGreater(refused, 0)
        coordinator.request_stop("test over")
        end_cluster(self, coordinator, roles)
        reader.join(30)
        self.assertFalse(reader.is_alive())
        rest = list(stream)  # ends at the channel's end message
        self.assertEqual(stream.end_reason, "test over")
        self.assertTrue(all(s["seq"] > first["seq"] for s in rest))

    def test_a_run_under_curve_admits_only_its_client_key(self):
        keys = tempfile.TemporaryDirectory()
        self.addCleanup(keys.cleanup)
        server = tandem.keygen(os.path.join(keys.name, "server"))
        tandem.keygen(os.path.join(keys.name, "client"))
        tandem.keygen(os.path.join(keys.name, "stranger"))
        # A name in use keeps its pair unless overwrite=True.
        with self.assertRaisesRegex(ValueError, "stranger.key exists"):
            tandem.keygen(os.path.join(keys.name, "stranger"))
        with open(os.path.join(keys.name, "stranger.key")) as f:
            old_text = f.read()
        new_key = tandem.keygen(os.path.join(keys.name, "stranger"), overwrite=True)
        with open(os.path.join(keys.name, "stranger.key")) as f:
            new_text = f.read()
        self.assertTrue(new_key in new_text and new_key not in old_text)
        path = lambda name: os.path.join(keys.name, name)  # noqa: E731
        client = {"curve_server_key": server, "curve_key_file": path("client.key_secret")}
        coordinator, roles, _ = start_fed_cluster(
            self, role_args=client, curve_secret_file=path("server.key_secret"),
            curve_allowed_path=path("client.key"), curve_client_file=path("client.key_secret"))
        self.assertEqual(coordinator.curve_public_key, server)
        roles[1].feed(*make_rows(500, 8))
        history = list(tandem.scores(coordinator.endpoint, follow=False, timeout_s=1, **client))
        self.assertTrue(history and all("loss" in s for s in history))
        # Another key, or none, gets no answer and is told why (after the 5 s request timeout).
        with self.assertRaisesRegex(tandem.Error, "CURVE authentication failed"):
            tandem.scores(coordinator.endpoint, curve_server_key=server,
                          curve_key_file=path("stranger.key_secret"))
        with self.assertRaisesRegex(tandem.Error, "may be under CURVE"):
            tandem.scores(coordinator.endpoint)
        with self.assertRaisesRegex(tandem.Error, "public key"):
            tandem.scores(coordinator.endpoint, curve_server_key="not a key")
        model = end_cluster(self, coordinator, roles)  # pull_model: the run's client key
        self.assertEqual(len(model.parameters()), 4)

    def test_roles_stopped_from_their_process_end_at_once(self):
        coordinator, roles, _ = start_fed_cluster(self)
        roles[1].feed(*make_rows(2000, 4))
        coordinator.close()  # the coordinator goes away while training
        started = time.monotonic()
        for role in roles:
            role.stop()
        for role in roles:
            self.assertTrue(role.join(10))
        # Well under the coordinator's and the servers' timeouts (15 s, 10 s).
        self.assertLess(time.monotonic() - started, 5)

    def test_a_role_ends_when_the_start_fails(self):
        coordinator = tandem.Coordinator({"fed": True, "model": "784-32-10"}, ps=1, workers=1,
                                         scorers=0, startup_timeout_s=1)
        self.addCleanup(coordinator.close)
        worker = tandem.WorkerRole(coordinator.endpoint)
        worker.start()
        self.assertEqual(coordinator.wait_for("failed", 10), "failed")
        self.assertIn("ps0 (not registered)", coordinator.failure)
        # It stops without training, with the run's error (not a normal end: a role's own
        # process, or a batch system's task, must not report success after a failed run).
        with self.assertRaisesRegex(tandem.Error,
                                    r"worker0: the run failed: .*ps0 \(not registered\)"):
            worker.join(10)

    def test_python_exits_cleanly_while_roles_train(self):
        # A script that ends while its roles still train: a daemon thread feeding the worker
        # holds the role object, which is then never destroyed. The roles ran on into the
        # process's exit: the worker crashed in OpenBLAS's sgemm under the library's freed
        # buffers (SIGSEGV), or a fed block's release took the GIL as the interpreter
        # finalized (SIGABRT): 11 exits of 14 before the exit hook. Now they end first, as
        # stop() ends them: the server writes its last checkpoint.
        script = """if True:
            import sys, threading, time
            sys.path.insert(0, sys.argv[1])
            import tandem
            from synthetic_rows import make_rows
            c = tandem.Coordinator({"fed": True, "batch": 50, "model": "784-32-10",
                                    "worker_threads": 1, "checkpoint_dir": sys.argv[2]},
                                   ps=1, workers=1, scorers=0, max_seconds=600)
            ps, w = tandem.ParameterServerRole(c.endpoint), tandem.WorkerRole(c.endpoint)
            ps.start(); w.start()
            assert c.wait_for("training", 30) == "training"
            x, y = make_rows(50, 1)
            def feed():
                while True:
                    w.feed(x.copy(), y.copy(), timeout_s=30)
            threading.Thread(target=feed, daemon=True).start()
            time.sleep(0.5)
            print("exiting", flush=True)
            """
        for attempt in range(3):
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__),
                                       tmp], capture_output=True, text=True, timeout=120)
                self.assertEqual((done.returncode, done.stdout), (0, "exiting\n"), done.stderr)
                self.assertNotIn("still running", done.stderr)
                self.assertTrue(any(n.startswith("ps0-step-") for n in os.listdir(tmp)),
                                os.listdir(tmp))

    def test_python_exits_cleanly_while_a_daemon_thread_trains(self):
        # tandem.train on a daemon thread when the script ends: the thread finds the exit gate
        # closed at its next step and waits there for the process to end. Training on crashed in
        # OpenBLAS under the exit's library destructors (SIGSEGV), and an exception ending it
        # aborted the process once it reached Python (SIGABRT), in a build between.
        script = """if True:
            import sys, threading, time
            sys.path.insert(0, sys.argv[1])
            import tandem
            from synthetic_rows import make_rows
            x, y = make_rows(20000, 1)
            def train():
                tandem.train((x, y), layers=[784, 256, 10], epochs=1000, batch=50,
                             backend="cpu", threads=2)
            threading.Thread(target=train, daemon=True).start()
            time.sleep(0.5)
            print("exiting", flush=True)
            """
        for attempt in range(3):
            done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual((done.returncode, done.stdout), (0, "exiting\n"), done.stderr)

    def test_python_exits_cleanly_while_a_daemon_thread_predicts_or_evaluates(self):
        # Model.predict / Model.evaluate on a daemon thread when the script ends: the exit hook
        # waits for the one running (and a next one waits for the exit). It crashed in OpenBLAS
        # under the exit's library destructors (SIGSEGV), 12 exits of 12.
        script = """if True:
            import sys, threading, time
            sys.path.insert(0, sys.argv[1])
            import tandem
            from synthetic_rows import make_rows
            x, y = make_rows(100000, 1)
            model = tandem.Model.initialized([784, 256, 10])
            def loop():
                while True:
                    if sys.argv[2] == "predict": model.predict(x, threads=1)
                    else: model.evaluate(x, y, threads=1)
            threading.Thread(target=loop, daemon=True).start()
            time.sleep(0.5)
            print("exiting", flush=True)
            """
        for call in ("predict", "evaluate", "predict"):
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__), call],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual((done.returncode, done.stdout), (0, "exiting\n"), done.stderr)
            # Waited for as long as the call takes (a second or two), not the hook's 30 s.
            self.assertNotIn("still running", done.stderr)
            self.assertLess(time.monotonic() - started, 20)

    def test_a_dropped_running_role_does_not_hang(self):
        coordinator = tandem.Coordinator({"fed": True, "model": "784-32-10"}, ps=1, workers=1,
                                         scorers=0, startup_timeout_s=60)
        worker = tandem.WorkerRole(coordinator.endpoint, coordinator_lost_s=2)
        worker.start()
        deadline = time.monotonic() + 10
        while not coordinator.state()["roles"][1:] and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(worker.running)
        started = time.monotonic()
        del worker  # still waiting for the cluster: let go of it after a short wait
        gc.collect()
        self.assertLess(time.monotonic() - started, 5)
        coordinator.close()  # the worker notices the coordinator is gone and ends on its own


if __name__ == "__main__":
    unittest.main(verbosity=2)
