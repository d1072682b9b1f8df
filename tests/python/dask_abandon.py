"""Closes a Dask cluster while Tandem's roles still run in it (the run never stopped): the
worker processes must end cleanly. Run by dask_test.py in a child process; prints "closed"."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from distributed import Client, LocalCluster  # noqa: E402

import tandem.dask as tdask  # noqa: E402
from synthetic_rows import make_rows  # noqa: E402

if __name__ == "__main__":
    with LocalCluster(n_workers=3, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        run, _ = tdask.start(client, ps=1, worker=1, scorer=1, validation=make_rows(100, 1),
                             batch=100, model="784-16-10")
        tdask.feed([make_rows(500, 2)], run)
        run.coordinator.close()  # as if the client went away
    print("closed")
