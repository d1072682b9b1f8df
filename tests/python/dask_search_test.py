"""tandem.dask.search with successive halving (budget=...) on a distributed.LocalCluster: the
known best configuration wins, the rungs keep what tandem search's halving keeps, a crashing
trial is reported and the search goes on, a promoted trial continues its run bit for bit, the
time budget stops the search, and bad arguments are refused. Also tandem.train's resume state,
which the promotions use."""

import os
import pickle
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tandem  # noqa: E402
import tandem.dask as tdask  # noqa: E402
from tandem._tandem import _SuccessiveHalving  # noqa: E402
from dask_test import LocalClusterTest  # noqa: E402
from synthetic_rows import make_rows  # noqa: E402

# threads=1 on the CPU backend (search's default too): the runs are bit-reproducible.
SETTINGS = dict(layers=[784, 16, 10], batch=100, backend="cpu", threads=1, seed=3)
TRAIN = make_rows(1500, 31)
VALIDATION = make_rows(300, 32)


def assert_same_model(test, a, b):
    test.assertEqual(a.layers, b.layers)
    for name, value in a.parameters().items():
        np.testing.assert_array_equal(value, b.parameters()[name], err_msg=name)


class ResumeStateTest(unittest.TestCase):
    def test_resumed_run_equals_the_uninterrupted_run(self):
        """tandem train --resume's guarantee (tests/trainer_test.cpp), through bytes: the state
        after 3 of 7 epochs, pickled as a Dask task argument would be, continues to the same
        parameters, Adam moments, step and validation loss as 7 epochs at once."""
        kw = dict(SETTINGS, validation=VALIDATION, learning_rate=0.01, keep_best=False,
                  return_state=True)
        whole, whole_summary, whole_state = tandem.train(TRAIN, epochs=7, **kw)
        _, first, state = tandem.train(TRAIN, epochs=3, **kw)
        self.assertEqual(first["epochs"], 3)
        state = pickle.loads(pickle.dumps(state))
        resumed, rest, resumed_state = tandem.train(TRAIN, epochs=7, resume=state, **kw)
        self.assertEqual(rest["epochs"], 4)  # only the missing epochs
        self.assertEqual(rest["steps"], whole_summary["steps"] - first["steps"])
        assert_same_model(self, resumed, whole)
        self.assertEqual(resumed_state, whole_state)  # moments, step and epoch too
        self.assertEqual(rest["validation"]["loss_sum"], whole_summary["validation"]["loss_sum"])
        self.assertEqual(len(tandem.train(TRAIN, epochs=1, **SETTINGS)), 2)  # callers as before

    def test_a_resumed_run_keeps_the_best_of_both_calls(self):
        """The state carries the run's best so far, as tandem train's checkpoint file does: a
        resumed run whose every new epoch is worse (here, diverged at a learning rate of 1e30)
        ends on the first call's best epoch, as the search's last rung must (its ranking counts
        every rung's epochs). The state once held the last parameters alone, and the resumed run
        kept the best of its own epochs: here a NaN model."""
        kw = dict(SETTINGS, validation=VALIDATION, return_state=True)
        _, first, state = tandem.train(TRAIN, epochs=3, learning_rate=0.01, **kw)
        model, rest, _ = tandem.train(TRAIN, epochs=5, learning_rate=1e30, resume=state, **kw)
        self.assertEqual(rest["epochs"], 2)
        self.assertEqual(rest["kept_epoch"], first["kept_epoch"])
        self.assertEqual(rest["validation"]["loss_sum"], first["validation"]["loss_sum"])
        self.assertTrue(all(np.isfinite(v).all() for v in model.parameters().values()))

    def test_a_finished_run_that_kept_an_earlier_epoch_trains_nothing_more(self):
        """As tandem train --resume of a finished run (a requeued job): the state of a run that
        kept an earlier epoch says how far the run went, and resumed with as many epochs it
        trains nothing and stays the kept epoch. It once trained the epochs after the kept one
        again, and ended on another model. Random labels: the validation loss rises as the model
        memorises the training rows, so the best epoch is an early one."""
        rng = np.random.default_rng(7)
        train = (TRAIN[0][:300], rng.integers(0, 10, 300).astype(np.uint8))
        validation = (VALIDATION[0][:100], rng.integers(0, 10, 100).astype(np.uint8))
        kw = dict(SETTINGS, validation=validation, learning_rate=0.1, return_state=True)
        model, first, state = tandem.train(train, epochs=8, **kw)
        self.assertLess(first["kept_epoch"], 8, "the test needs a best epoch before the last")
        again, rest, state_again = tandem.train(train, epochs=8, resume=state, **kw)
        self.assertEqual(rest["epochs"], 0)
        self.assertEqual(rest["kept_epoch"], first["kept_epoch"])
        assert_same_model(self, again, model)
        self.assertEqual(state_again, state)
        # Asked for more epochs than it went, it goes on from the kept epoch, as the CLI does.
        _, more, _ = tandem.train(train, epochs=9, resume=state, **kw)
        self.assertEqual(more["epochs"], 9 - first["kept_epoch"])

    def test_bad_states_are_refused(self):
        _, _, state = tandem.train(TRAIN, epochs=1, return_state=True, **SETTINGS)
        with self.assertRaisesRegex(tandem.InputError,
                                    "holds model 784-16-10, this run asks for 784-8-10"):
            tandem.train(TRAIN, epochs=2, resume=state, **dict(SETTINGS, layers=[784, 8, 10]))
        with self.assertRaisesRegex(tandem.InputError, "trained with adam, this run asks for sgd"):
            tandem.train(TRAIN, epochs=2, resume=state, optimizer="sgd", **SETTINGS)
        with self.assertRaisesRegex(tandem.InputError, "resume state"):
            tandem.train(TRAIN, epochs=2, resume=state[:-10], **SETTINGS)
        with self.assertRaisesRegex(TypeError, "bytes"):
            tandem.train(TRAIN, epochs=2, resume="state", **SETTINGS)


class SuccessiveHalvingSearchTest(LocalClusterTest):
    dask_workers = 2

    def test_halving_keeps_the_best_stops_the_rest_and_survives_a_crash(self):
        # 0.01 learns the bands within an epoch; the others barely move: the known best is
        # trial 4. Trial 9's input width is wrong, so its first job crashes.
        rates = [1e-6, 2e-6, 5e-6, 1e-5, 0.01, 2e-5, 3e-6, 4e-6, 3e-5]
        configs = [{"learning_rate": r} for r in rates]
        configs.append({"learning_rate": 0.01, "layers": [100, 16, 10]})
        # One slot: the order of jobs is fixed, so the halving can be replayed below.
        # keep_best=False: a completed trial ends at its last epoch, comparable with a plain run.
        results = tdask.search(self.client, configs, TRAIN, VALIDATION, budget=9, min_epochs=1,
                               eta=3, slots=1, keep_best=False, **SETTINGS)
        self.assertEqual(len(results), len(configs))
        by_trial = {r["trial"]: r for r in results}
        rungs = [1, 3, 9]

        # (a) The known best comes first, trained the whole budget.
        best = results[0]
        self.assertEqual(best["trial"], 4, [(r["trial"], r.get("best_validation_loss")) for r in results])
        self.assertEqual((best["status"], best["rung"], best["epochs"]), ("completed", 2, 9))
        self.assertGreater(best["validation"]["accuracy"], 0.9)
        # The results are ordered by each trial's best loss so far.
        losses = [r["best_validation_loss"] for r in results if "validation" in r]
        self.assertEqual(losses, sorted(losses))

        # (c) The crash is reported with the engine's message, last, and the rest went on.
        crashed = by_trial[9]
        self.assertEqual(crashed["status"], "failed")
        self.assertIn("model 100-16-10 expects 100", crashed["error"])
        self.assertEqual((crashed["rung"], crashed["epochs"]), (-1, 0))
        self.assertIs(results[-1], crashed)

        # (b) The same halving driven by the losses the trials reported: every trial ends with
        # the status and rung the search gave it.
        halving = _SuccessiveHalving(len(configs), 1, 9, 3)
        self.assertEqual(halving.rung_epochs, rungs)
        while (job := halving.next()) is not None:
            trial, rung, epochs = job
            if "error" in by_trial[trial]:
                halving.fail(trial)
            else:
                # The loss of the rung's last epoch, as tandem search ranks a rung.
                halving.report(trial, by_trial[trial]["validation_losses"][epochs - 1])
        self.assertTrue(halving.done())
        for t, r in by_trial.items():
            self.assertEqual((r["status"], r["rung"]), (halving.status(t), halving.rung(t)), t)
        # ... and ASHA's rule, checked from the losses alone: of the n trials that finished
        # rung k, at least the top max(1, n // eta) by their loss there finished rung k + 1.
        finished = [[r for r in results if r.get("rung", -1) >= k] for k in range(3)]
        self.assertEqual(len(finished[0]), 9)
        for k in range(2):
            def loss_at(r, k=k):
                return r["validation_losses"][rungs[k] - 1]
            keep = max(1, len(finished[k]) // 3)
            top = sorted(finished[k], key=loss_at)[:keep]
            self.assertTrue(all(r["rung"] >= k + 1 for r in top), (k, [r["trial"] for r in top]))
            self.assertLess(len(finished[k + 1]), len(finished[k]))  # some were stopped
        # Stopped trials trained their rung's epochs and no more; completed ones the budget.
        for r in results:
            if r["status"] == "stopped":
                self.assertEqual(r["epochs"], rungs[r["rung"]], r["trial"])
                self.assertEqual(len(r["validation_losses"]), r["epochs"])
                self.assertNotIn("state", r)  # dropped as the trial stopped
            elif r["status"] == "completed":
                self.assertEqual(r["epochs"], 9)
        self.assertGreater(sum(r["status"] == "stopped" for r in results), 0)

        # (d) Promoted twice (1 -> 3 -> 9 epochs, on Dask workers), the best ends exactly as one
        # uninterrupted 9-epoch run here: the engine resumes bit-identically on the CPU.
        whole, whole_summary, whole_state = tandem.train(
            TRAIN, validation=VALIDATION, epochs=9, keep_best=False, return_state=True,
            **dict(SETTINGS, **configs[4]))
        assert_same_model(self, best["model"], whole)
        self.assertEqual(best["validation"]["loss_sum"], whole_summary["validation"]["loss_sum"])
        self.assertEqual(best["state"], whole_state)

    def test_a_rung_is_ranked_by_its_last_epoch(self):
        """As tandem search ranks a rung: by the loss of its last epoch, the state a promotion
        resumes from, not the trial's best so far. Noisy labels on 200 rows: at a learning rate
        of 0.01 the validation loss dips at epoch 3 and is back up at epoch 4, while at 0.003 it
        falls steadily. Ranked by the best so far, 0.01 went on from a state worse than 0.003's."""
        images, labels = make_rows(200, 31)
        labels = labels.copy()
        rng = np.random.default_rng(1)
        noisy = rng.choice(200, 100, replace=False)
        labels[noisy] = rng.integers(0, 10, 100)
        settings = dict(SETTINGS, layers=[784, 64, 10], batch=20)
        configs = [{"learning_rate": 0.01}, {"learning_rate": 0.003}]
        results = tdask.search(self.client, configs, (images, labels), VALIDATION, budget=8,
                               min_epochs=4, eta=2, slots=1, keep_best=False, **settings)
        by_trial = {r["trial"]: r for r in results}
        dipped, steady = by_trial[0]["validation_losses"], by_trial[1]["validation_losses"]
        self.assertTrue(min(dipped[:4]) < min(steady[:4]) and dipped[3] > steady[3],
                        ("the test needs trial 0 best earlier, trial 1 best at epoch 4",
                         dipped, steady))
        self.assertEqual((by_trial[1]["status"], by_trial[1]["rung"]), ("completed", 1))
        self.assertEqual((by_trial[0]["status"], by_trial[0]["rung"]), ("stopped", 0))

    def test_time_budget_stops_the_search(self):
        configs = [{"learning_rate": r} for r in (0.01, 0.001, 0.0001)]
        results = tdask.search(self.client, configs, TRAIN, VALIDATION, budget=9,
                               budget_seconds=0.001, slots=1, **SETTINGS)
        self.assertEqual([r["status"] for r in results], ["stopped"] * 3)
        self.assertTrue(all(r["stopped_by_time_budget"] for r in results))
        started = [r for r in results if r["rung"] >= 0]
        self.assertLessEqual(len(started), 1)  # one slot: at most the first job ran, and counts
        self.assertTrue(all(r["epochs"] == 1 for r in started))
        self.assertTrue(all(r["epochs"] == 0 for r in results if r["rung"] < 0))

    def test_bad_arguments_are_refused(self):
        configs = [{"learning_rate": 0.01}]
        cases = [(dict(budget=9, eta=1), "eta=1: expected >= 2"),
                 (dict(budget=2, min_epochs=3), r"budget=2: expected >= min_epochs \(3\)"),
                 (dict(budget=3, min_epochs=0), "min_epochs=0: expected >= 1"),
                 (dict(budget=3, epochs=5), "successive halving sets epochs"),
                 (dict(eta=2), "give budget"),
                 (dict(budget=3, slots=0), "slots >= 1"),
                 # (without budget it failed every trial, unpacking three values for two)
                 (dict(epochs=1, return_state=True), "return_state is not for search")]
        for kwargs, message in cases:
            with self.subTest(**kwargs), self.assertRaisesRegex(tandem.InputError, message):
                tdask.search(self.client, configs, TRAIN, VALIDATION, **kwargs)
        with self.assertRaisesRegex(tandem.InputError, "successive halving sets epochs"):
            tdask.search(self.client, [{"epochs": 4}], TRAIN, VALIDATION, budget=3)
        # The same configuration twice (from a grid too): refused, as tandem search refuses it.
        for twice in ([{"learning_rate": 0.1}, {"learning_rate": 1e-1}],
                      {"learning_rate": [0.1, 0.1], "layers": [[784, 8, 10]]}):
            with self.subTest(twice=twice), self.assertRaisesRegex(
                    tandem.InputError, "configs 0 and 1 are the same configuration"):
                tdask.search(self.client, twice, TRAIN, VALIDATION, budget=2)
        # No validation rows: nothing to rank by, refused before any trial trains (it was each
        # trial's TypeError, or the ranking's AttributeError after all of them ran).
        empty = (VALIDATION[0][:0], VALIDATION[1][:0])
        for kwargs in ({}, {"budget": 2}):
            with self.subTest(**kwargs), self.assertRaisesRegex(tandem.InputError,
                                                                "needs validation rows"):
                tdask.search(self.client, configs, TRAIN, empty, **kwargs)

    def test_a_keyword_of_the_wrong_type_fails_its_trial_without_the_arrays(self):
        # pybind11's TypeError listed every argument, the training arrays whole, in the error.
        configs = [dict(SETTINGS, learning_rate=lr, epochs=1) for lr in (0.01, "fast")]
        for kwargs in ({}, {"budget": 1}):
            with self.subTest(**kwargs):
                cs = [{k: v for k, v in c.items() if not (kwargs and k == "epochs")}
                      for c in configs]
                results = tdask.search(self.client, cs, TRAIN, VALIDATION, **kwargs)
                failed = [r for r in results if r["status"] == "failed"]
                self.assertEqual([r["config"]["learning_rate"] for r in failed], ["fast"])
                error = failed[0]["error"]
                self.assertIn("TypeError", error)
                self.assertIn("a keyword of the trial has the wrong type", error)
                self.assertNotIn("Invoked with", error)
                self.assertLess(len(error), 2000, error[:300])


if __name__ == "__main__":
    unittest.main(verbosity=2)
