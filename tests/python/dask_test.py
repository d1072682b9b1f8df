"""tandem.dask on a real distributed.LocalCluster of separate worker processes: start the roles
inside the Dask workers, feed them dask-array blocks in place, train to a target, stop, and the
Dask cluster still runs tasks; errors of the roles reach the client with the engine's message."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import dask.array as da  # noqa: E402
from dask import delayed  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import tandem  # noqa: E402
import tandem.dask as tdask  # noqa: E402
from synthetic_rows import make_rows  # noqa: E402

SETTINGS = dict(batch=100, model="784-32-10", score_interval_s=0.2, worker_threads=1,
                scorer_threads=1)


def dask_blocks(client, count, rows, seed):
    """Blocks of (images, labels) computed on the cluster, as the seed prepares them."""
    parts = [delayed(make_rows)(rows, seed + i) for i in range(count)]
    images = da.concatenate([da.from_delayed(p[0], (rows, 784), np.uint8) for p in parts])
    labels = da.concatenate([da.from_delayed(p[1], (rows,), np.uint8) for p in parts])
    images, labels = client.persist([images, labels])
    blocks = [delayed(lambda a, b: (a, b))(i, l)
              for i, l in zip(images.to_delayed().ravel(), labels.to_delayed().ravel())]
    return client.compute(blocks)


class LocalClusterTest(unittest.TestCase):
    """A LocalCluster of `dask_workers` separate processes (2 threads each), shared by the
    class's tests."""

    dask_workers = 4

    @classmethod
    def setUpClass(cls):
        cls.cluster = LocalCluster(n_workers=cls.dask_workers, threads_per_worker=2,
                                   processes=True, dashboard_address=None)
        cls.client = Client(cls.cluster)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()


class DaskTest(LocalClusterTest):

    def assert_cluster_healthy(self):
        """Every Dask worker runs a task once the roles are gone."""
        addresses = list(self.client.nthreads())
        self.assertEqual(len(addresses), 4)
        for address in addresses:
            future = self.client.submit(lambda x: x + 1, 41, workers=[address], pure=False)
            self.assertEqual(future.result(timeout=30), 42)

    def test_start_feed_train_to_target_stop(self):
        xv, yv = make_rows(500, 99)
        cluster, dask_spec = tdask.start(self.client, ps=1, worker=2, scorer=1,
                                         validation=(da.from_array(xv), yv), target=25.0,
                                         max_seconds=120, **SETTINGS)
        self.assertEqual(len(dask_spec["worker"]), 2)
        self.assertEqual(len(set(sum(dask_spec.values(), []))), 4)  # one role per process
        spec = cluster.as_dict()
        self.assertEqual([r["name"] for r in spec["worker"]], ["worker0", "worker1"])
        self.assertTrue(spec["ps"][0]["address"].startswith("tcp://127.0.0.1:"))
        blocks = dask_blocks(self.client, 6, 1000, seed=0)
        rounds, transfers = 0, []
        while cluster.training and rounds < 40:
            transfers += [f.result() for f in tdask.feed(blocks, cluster)]
            rounds += 1
        result = tdask.stop(cluster)
        self.assertEqual(result["stop_reason"], "target")
        self.assertLess(result["scores"][-1]["loss"], 25.0)
        self.assertLess(result["model"].evaluate(xv, yv)["loss_sum"], 100.0)
        # The blocks were read where Dask holds them: no copy of pixels or labels.
        fed = [t for t in transfers if t["rows"] > 0]
        self.assertTrue(fed)
        self.assertFalse(any(t["pixels_copied"] or t["labels_copied"] for t in fed))
        roles = {r["name"]: r for r in result["roles"]}
        self.assertEqual(set(roles), {"ps0", "worker0", "worker1", "scorer0"})
        self.assertGreater(roles["worker0"]["rows_fed"] + roles["worker1"]["rows_fed"], 0)
        # Both workers got blocks (the shares are kept even).
        self.assertGreater(roles["worker0"]["blocks_fed"], 0)
        self.assertGreater(roles["worker1"]["blocks_fed"], 0)
        self.assertEqual(cluster.phase, "done")
        self.assertFalse(cluster.training)
        self.assert_cluster_healthy()

    def test_a_role_error_reaches_the_client(self):
        # The scorer's validation rows hold a label past the model's classes: it fails in its
        # role, on its Dask worker, and the client's calls raise its error.
        xv, yv = make_rows(200, 98)
        yv = yv.copy()
        yv[3] = 12
        cluster, _ = tdask.start(self.client, ps=1, worker=2, scorer=1, validation=(xv, yv),
                                 max_seconds=120, **SETTINGS)
        deadline = time.monotonic() + 60
        with self.assertRaisesRegex(tandem.Error, "label 12 at row 3"):
            tdask.feed([make_rows(500, 4), make_rows(500, 5)], cluster)
            while time.monotonic() < deadline:  # until the scorer's first score fails it
                cluster.check()
                time.sleep(0.05)
        with self.assertRaisesRegex(tandem.Error, "scorer0: .*label 12 at row 3"):
            tdask.stop(cluster)
        self.assert_cluster_healthy()

    def test_a_bad_fed_block_is_refused_to_its_feeder(self):
        xv, yv = make_rows(200, 98)
        cluster, _ = tdask.start(self.client, ps=1, worker=2, scorer=1, validation=(xv, yv),
                                 max_seconds=120, **SETTINGS)
        x, y = make_rows(100, 1)
        y[5] = 11
        with self.assertRaisesRegex(tandem.InputError, "label 11 at row 5"):
            tdask.feed([(x, y), (x, y)], cluster)
            for _ in range(100):  # until the worker's failure is seen
                tdask.feed([make_rows(100, 2)], cluster)
        # Refused before it was queued, once the worker knows its model: the run goes on. Fed
        # before that (this test feeds at once), it failed the worker, and with it the run.
        # Which one depends on the timing (the bad block is the first fed).
        try:
            result = tdask.stop(cluster)
        except tandem.Error as e:
            self.assertIn("label 11 at row 5", str(e))
        else:
            self.assertEqual(result["stop_reason"], "requested")
        self.assert_cluster_healthy()

    def test_a_run_under_curve_gives_its_roles_the_keys(self):
        keys = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, keys)
        for name in ("server", "client"):
            tandem.keygen(os.path.join(keys, name))
        xv, yv = make_rows(200, 97)
        cluster, _ = tdask.start(
            self.client, ps=1, worker=2, scorer=1, validation=(xv, yv), max_seconds=120,
            curve_secret_file=os.path.join(keys, "server.key_secret"),
            curve_allowed_path=os.path.join(keys, "client.key"),
            curve_client_file=os.path.join(keys, "client.key_secret"), **SETTINGS)
        self.assertTrue(cluster.coordinator.curve_public_key)
        tdask.feed([make_rows(500, 4), make_rows(500, 5)], cluster)
        self.assertIn("loss", next(cluster.follow_scores(timeout_s=30)))
        result = tdask.stop(cluster)
        self.assertEqual(result["stop_reason"], "requested")
        self.assertEqual({r["name"] for r in result["roles"]}, {"ps0", "worker0", "worker1", "scorer0"})
        self.assert_cluster_healthy()

    def test_two_runs_on_the_same_dask_workers_train_on_their_own_blocks(self):
        # Each Dask worker runs a role of both runs; a block fed to one run once went to the
        # newer run's Tandem worker there.
        xv, yv = make_rows(200, 96)
        runs = [tdask.start(self.client, ps=1, worker=2, scorer=1, validation=(xv, yv),
                            max_seconds=120, **SETTINGS) for _ in range(2)]
        (first, first_spec), (second, second_spec) = runs
        self.assertEqual(first_spec, second_spec)  # the same Dask workers
        try:
            tdask.feed([make_rows(100, 6), make_rows(100, 7)], first)
            self.assertIn("loss", next(first.follow_scores(timeout_s=30)))  # it trained
        finally:
            results = [tdask.stop(first), tdask.stop(second)]
        fed = [sum(r.get("rows_fed", 0) for r in result["roles"]) for result in results]
        self.assertEqual(fed, [200, 0])
        self.assertIsInstance(results[0]["model"], tandem.Model)
        self.assert_cluster_healthy()

    def test_start_errors(self):
        xv, yv = make_rows(100, 3)
        with self.assertRaisesRegex(tandem.InputError, "needs 7; the cluster has 4"):
            tdask.start(self.client, ps=1, worker=5, scorer=1, validation=(xv, yv))
        with self.assertRaisesRegex(tandem.InputError, "the scorer needs rows to score on"):
            tdask.start(self.client, ps=1, worker=1, scorer=1, **SETTINGS)
        with self.assertRaisesRegex(tandem.InputError,
                                    "validation must be .images, labels., not int"):
            tdask.start(self.client, ps=1, worker=1, scorer=1, validation=5, **SETTINGS)
        # Scored, no rows gave a loss of 0, which met any target at once.
        with self.assertRaisesRegex(tandem.InputError, "validation has no rows"):
            tdask.start(self.client, ps=1, worker=1, scorer=1, validation=(xv[:0], yv[:0]),
                        target=1750, **SETTINGS)
        some = sorted(self.client.nthreads())[0]
        with self.assertRaisesRegex(tandem.InputError, "not a string"):
            tdask.start(self.client, ps=1, worker=1, scorer=0, dask_workers=some,
                        max_seconds=5, **SETTINGS)
        with self.assertRaisesRegex(tandem.InputError, "names .* more than once"):
            tdask.start(self.client, ps=1, worker=1, scorer=0, dask_workers=[some, some],
                        max_seconds=5, **SETTINGS)
        # A role that fails while the cluster starts: the engine's message, from the Dask
        # worker; the roles already started end.
        with self.assertRaisesRegex(tandem.InputError, "device must be cpu, cuda or auto, not 'tpu'"):
            tdask.start(self.client, ps=1, worker=2, scorer=1, validation=(xv, yv),
                        ps_device="tpu", startup_timeout=30, **SETTINGS)
        self.assert_cluster_healthy()


class SimpleParallelismTest(LocalClusterTest):
    """The seed's client.map(train_and_evaluate, ...) and map_partitions(predict)."""

    dask_workers = 2

    def test_search_ranks_the_trials_and_reports_a_crash(self):
        train = make_rows(2000, 11)
        validation = make_rows(400, 12)
        # A learning rate of 1e-6 cannot learn in 2 epochs; 0.01 does: the known best. 1e30
        # diverges: its trial fails saying so, as tandem.train raises and a `tandem search` trial
        # exits 1 (it once ranked, with its NaN loss, among the trials that trained). A model
        # whose input width is wrong crashes its trial, and the search goes on.
        grid = {"learning_rate": [1e-6, 1e30, 0.01], "layers": [[784, 16, 10], [100, 16, 10]]}
        self.assertEqual(len(tdask.expand_grid(grid)), 6)
        results = tdask.search(self.client, grid, (da.from_array(train[0], chunks=500), train[1]),
                               validation, epochs=2, batch=100)
        self.assertEqual(len(results), 6)
        self.assertEqual(results[0]["config"], {"learning_rate": 0.01, "layers": [784, 16, 10]})
        self.assertGreater(results[0]["validation"]["accuracy"], 0.9)
        self.assertEqual(results[1]["config"]["learning_rate"], 1e-6)
        self.assertGreater(results[1]["validation"]["loss_sum"], results[0]["validation"]["loss_sum"])
        crashed = [r for r in results if "error" in r]
        self.assertEqual(len(crashed), 4)
        self.assertEqual(results[2:], crashed)  # failures last
        diverged = [r for r in crashed if r["config"] == {"learning_rate": 1e30,
                                                          "layers": [784, 16, 10]}]
        self.assertEqual(len(diverged), 1, crashed)
        self.assertIn("InputError: training diverged: the kept parameters give a validation loss "
                      "of", diverged[0]["error"])
        self.assertTrue(all("model 100-16-10 expects 100" in r["error"]
                            for r in crashed if r is not diverged[0]), crashed)
        # The best model came back whole: it scores as its trial said.
        best = results[0]["model"].evaluate(*validation)
        self.assertAlmostEqual(best["loss_sum"], results[0]["validation"]["loss_sum"], places=2)

    def test_search_again_on_the_same_data_and_keywords_checked_first(self):
        # The data is sent as new Dask data every time: named by its contents, a second search
        # of the same arrays reused the key Dask was still releasing from the first, and its
        # trials failed on "lost dependencies" (nine runs in ten).
        train, validation = make_rows(400, 13), make_rows(100, 14)
        for _ in range(4):
            results = tdask.search(self.client, [{"learning_rate": 0.01}], train, validation,
                                   epochs=1, batch=100, layers=[784, 8, 10])
            self.assertEqual([r["status"] for r in results], ["completed"], results)
        # tandem search's names, or a typo: refused before any data is sent, naming the key.
        with self.assertRaisesRegex(tandem.InputError, "trial 1: 'lr' is not a tandem.train "
                                    "keyword .tandem search's 'lr' is 'learning_rate' here"):
            tdask.search(self.client, [{"seed": 2}, {"lr": 0.1}], train, validation)
        with self.assertRaisesRegex(tandem.InputError, "common: 'epoch' is not a tandem.train "
                                    "keyword; expected one of backend, batch, epochs"):
            tdask.search(self.client, [{}], train, validation, epoch=2)

    def test_predict_block_by_block_equals_predicting_at_once(self):
        model, _ = tandem.train(make_rows(2000, 21), layers=[784, 16, 10], epochs=1, batch=100,
                                backend="cpu", threads=1)
        images, _ = make_rows(2500, 22)
        lazy = tdask.predict(model, da.from_array(images.reshape(2500, 28, 28), chunks=(700, 14, 28)))
        self.assertEqual(lazy.chunks, ((700, 700, 700, 400),))
        np.testing.assert_array_equal(self.client.compute(lazy).result(), model.predict(images))


class LostDaskWorkerTest(unittest.TestCase):
    def test_a_tandem_worker_whose_process_dies_is_left_out(self):
        """The Dask worker process of a Tandem worker is killed mid-run (its nanny starts a new
        one at another address, where the role's task, bound to the old one, would wait for
        ever): feed gives the blocks to the other worker, the run goes on, and stop names the
        lost role instead of waiting for its task."""
        with LocalCluster(n_workers=4, threads_per_worker=2, processes=True,
                          dashboard_address=None) as dask_cluster, Client(dask_cluster) as client:
            xv, yv = make_rows(500, 99)
            cluster, dask_spec = tdask.start(client, ps=1, worker=2, scorer=1,
                                             validation=(xv, yv), max_seconds=120,
                                             heartbeat_timeout=2.0, **SETTINGS)
            blocks = dask_blocks(client, 4, 500, seed=0)
            self.assertEqual(sum(f.result()["rows"] for f in tdask.feed(blocks, cluster)), 2000)
            victim = dask_spec["worker"][1]
            os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
            for _ in range(300):  # until the scheduler has seen it go
                if victim not in client.nthreads():
                    break
                time.sleep(0.1)
            self.assertNotIn(victim, client.nthreads())
            self.assertTrue(cluster.training)  # a lost Tandem worker is no error for the run
            transfers = [f.result() for f in tdask.feed(blocks, cluster)]
            self.assertEqual(sum(t["rows"] for t in transfers), 2000)
            result = tdask.stop(cluster, timeout=60)
            roles = {r["name"]: r for r in result["roles"]}
            self.assertEqual(set(roles), {"ps0", "worker0", "worker1", "scorer0"})
            self.assertIn(victim, roles["worker1"]["lost"])
            self.assertNotIn("lost", roles["worker0"])
            self.assertGreaterEqual(roles["worker0"]["blocks_fed"], 4)
            self.assertIsNotNone(result["model"])


class WithoutAClusterTest(unittest.TestCase):
    """What is decided before any Dask cluster is used."""

    def test_in_process_workers_keep_the_run_on_loopback(self):
        """LocalCluster(processes=False) names its workers inproc://MACHINE-ADDRESS/...: they
        run in this process, so the coordinator listens on loopback, not on every interface
        (where the run, without CURVE, was open to the network)."""
        workers = ["inproc://192.0.2.2/12345/1", "inproc://192.0.2.2/12345/2"]
        self.assertEqual(tdask._advertised_bind(workers), ("tcp://127.0.0.1:*", ""))
        self.assertEqual(tdask._advertised_bind(["tcp://127.0.0.1:4000"]),
                         ("tcp://127.0.0.1:*", ""))
        self.assertEqual(tdask._host_of("tcp://10.1.2.3:4000"), "10.1.2.3")

    def test_feeding_one_pair_instead_of_a_list_says_so(self):
        # Refused before the cluster is looked at: it failed inside a Dask task, unpacking.
        x, y = make_rows(10, 1)
        for pair in ((x, y), [x, y], (da.from_array(x), da.from_array(y))):
            with self.assertRaisesRegex(TypeError,
                                        r"for one block, give \[\(images, labels\)\]"):
                tdask.feed(pair, None)
        # Two blocks are no pair: delayed ones (whose ndim, asked, is a Delayed) neither.
        blocks = [delayed(lambda: (x, y))(), delayed(lambda: (x, y))()]
        self.assertFalse(tdask._one_pair(blocks))
        self.assertFalse(tdask._one_pair([(x, y), (x, y)]))


class AbandonedRunTest(unittest.TestCase):
    def test_closing_dask_with_roles_running_ends_them_cleanly(self):
        """The run is never stopped and its coordinator goes away: closing the Dask cluster
        ends the roles (tandem.dask's worker plugin), and no worker process has to be killed."""
        script = os.path.join(os.path.dirname(__file__), "dask_abandon.py")
        done = subprocess.run([sys.executable, script], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ))
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertIn("closed", done.stdout)
        self.assertNotIn("terminate called", done.stderr)
        self.assertNotIn("still alive after", done.stderr)  # the nanny had to kill it


if __name__ == "__main__":
    unittest.main(verbosity=2)
