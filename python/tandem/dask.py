"""Tandem inside a Dask cluster: the seed's ``start_tensorflow`` workflow with Tandem's engine.

Dask prepares the data and already runs processes on every node; Tandem's roles run inside them
as long-running tasks (one role per Dask worker process), and training batches go from dask
arrays straight into the queue of the Tandem worker living in the same process::

    from tandem.dask import start, feed, stop
    cluster, dask_spec = start(client, ps=1, worker=4, scorer=1,
                               validation=(val_images, val_labels), target=1000, batch=1000)
    while cluster.training:
        feed(batches, cluster)          # futures of (images, labels) blocks
    result = stop(cluster)              # final parameters, scores, the roles' summaries

The coordinator runs in the client's process; the roles join it over ZeroMQ, so the client must
be reachable from the Dask workers (as Dask's own client is).

The seed's simple parallelism is here too: ``search(client, configs, train, validation)`` trains
a model per configuration on the Dask workers and ranks them (with ``budget=EPOCHS``, stopping
hopeless trials early by tandem search's successive halving), ``predict(model, images)`` applies
a model to a dask array block by block (``predict(model, images, out)`` writes the classes and
probabilities as ``tandem predict`` does, a resumable Zarr group).
"""

from __future__ import annotations

import asyncio
import atexit
import math
import socket
import time
import uuid
from urllib.parse import urlparse

from ._tandem import (Coordinator, Error, InputError, ParameterServerRole, ScorerRole,
                      WorkerRole, scores as _scores)

from ._dask_parallel import expand_grid, predict, search  # noqa: F401 - the seed's simple parallelism

__all__ = ["TandemCluster", "start", "feed", "stop", "local_worker", "search", "predict",
           "expand_grid"]

# The roles running in this process: by the address of the Dask worker that runs them (a
# LocalCluster with processes=False has several Dask workers in one process), then by run (the
# id start() gives it: an endpoint could be a later run's, on a port reused), the newest last.
# Two runs may share Dask workers: each block fed goes to its own run's Tandem worker.
_local_roles: dict = {}
# Ended runs remembered per Dask worker (with their roles, a scorer's validation rows included)
# besides those still running: a block that comes after its run ended finds the run, and learns
# that training is over.
_ENDED_RUNS_KEPT = 1


def _register_role(address, run, kind, role):
    runs = _local_roles.setdefault(address, {})
    runs.pop(run, None)
    runs[run] = (kind, role)
    ended = [r for r, (_, other) in runs.items() if r != run and not other.running]
    for old in ended[:max(0, len(ended) - _ENDED_RUNS_KEPT)]:
        del runs[old]


@atexit.register
def _stop_local_roles(addresses=None):
    """A Dask worker process that exits with roles still running (the run was never stopped)
    ends them first: their threads must not outlive the interpreter. addresses: only the roles
    of those Dask workers (None: every one in the process)."""
    roles = [role for address, runs in list(_local_roles.items())
             if addresses is None or address in addresses
             for _, role in list(runs.values())]
    for role in roles:
        role.stop()
    for role in roles:
        try:
            role.join(timeout_s=10)
        except Exception:  # noqa: BLE001 - exiting: the role's error was reported by its task
            pass


def _role_stopper():
    """A Dask worker plugin whose teardown (the Dask worker closing) ends the Tandem roles in its
    process: their task threads would otherwise hold the worker's close until it is killed."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class TandemRoleStopper(WorkerPlugin):
        name = "tandem-role-stopper"

        def teardown(self, worker):
            # Also called on a running worker when a plugin of this name is registered again
            # (a second start() on the cluster): that is no end for the roles of a run still
            # going. And only this Dask worker's roles: with processes=False, the others of the
            # process keep theirs.
            if getattr(worker.status, "name", "") in ("running", "paused"):
                return
            _stop_local_roles([worker.address])

    return TandemRoleStopper()


def _host_of(address: str) -> str:
    # An inproc:// worker (LocalCluster(processes=False)) runs in this process: its address
    # names the machine's network address, but loopback reaches it, and listening on every
    # interface for it opened the run to the network.
    if address.startswith("inproc://"):
        return "127.0.0.1"
    return urlparse(address).hostname or "127.0.0.1"


def _curve_arguments(coordinator):
    """For a run under CURVE (settings curve_secret_file=...): the keyword arguments that let a
    role or a score stream join it, with the run's client key file (curve_client_file) when
    there is one. None otherwise."""
    if not coordinator.curve_public_key:
        return None
    return {"curve_server_key": coordinator.curve_public_key,
            "curve_key_file": coordinator.settings.get("curve_client_file", "")}


def _role_task(kind, coordinator, name, queue_blocks, validation, curve=None, run=None):
    """A Dask task: one Tandem role, for as long as the run lasts.

    curve: for a run under CURVE, the roles' keyword arguments (curve_server_key, and
    curve_key_file: the run's client key file, a path the Dask worker's node must see)."""
    from distributed import get_worker, secede

    worker = get_worker()
    # Out of Dask's thread pool: the role runs for the whole run, and the feeding tasks still
    # need the worker's threads.
    secede()
    curve = curve or {}
    if kind == "ps":
        role = ParameterServerRole(coordinator, name, bind=f"tcp://{_host_of(worker.address)}:*",
                                   **curve)
    elif kind == "worker":
        role = WorkerRole(coordinator, name, capacity=queue_blocks, **curve)
    else:
        role = ScorerRole(coordinator, name, validation=validation, **curve)
    # Stays registered after the run: a transfer that comes after the role ended finds it, and
    # learns that training is over (or the role's error), not that no worker runs here.
    _register_role(worker.address, run or coordinator, kind, role)
    started = time.time()
    role.start()
    role.join()  # raises the role's error with the engine's message
    result = {"kind": kind, "name": name, "dask_worker": worker.address,
              "seconds": time.time() - started}
    if kind == "worker":
        result.update(rows_fed=role.rows_fed, blocks_fed=role.blocks_fed)
    return result


def local_worker(run=None):
    """The Tandem worker role running in this Dask worker process (for custom feeding tasks).

    run: the run's id (``cluster.run_id``), for a Dask worker that runs roles of several runs;
    None: the newest run's."""
    from distributed import get_worker

    address = get_worker().address
    runs = _local_roles.get(address, {})
    if run is None:
        kind, role = list(runs.values())[-1] if runs else (None, None)
    else:
        kind, role = runs.get(run, (None, None))
    if kind != "worker":
        of_run = "" if run is None else f" for the run of {run}"
        raise RuntimeError(f"no Tandem worker runs in the Dask worker {address}{of_run}: feed "
                           "only the Dask workers listed in dask_spec['worker']")
    return role


def _transfer(batch, timeout_s=None, run=None):
    """A Dask task: hands one (images, labels) block to this process's Tandem worker of `run`."""
    images, labels = batch
    role = local_worker(run)
    try:
        return role.feed(images, labels, timeout_s=timeout_s)
    except InputError:  # the block itself is bad: its own error, at once
        raise
    except Error:
        # The worker closed its queue. If it stopped on an error, join raises that error here
        # (the block's task fails with the worker's own message); if training is simply over,
        # the block is not needed any more.
        if role.join(timeout_s=1.0):
            return {"rows": 0, "dropped": len(images)}
        raise


class TandemCluster:
    """A Tandem run inside a Dask cluster (what start() returns first, like the seed's tf_spec).

    ``as_dict()`` is the cluster spec: the coordinator, the scores channel, and each role's name,
    address and host. ``coordinator`` is the tandem.Coordinator in this process.
    """

    def __init__(self, client, coordinator, futures, dask_spec, run_id=None):
        self.client = client
        self.run_id = run_id  # names this run's roles in the Dask workers (local_worker(run))
        self.coordinator = coordinator
        self.futures = futures  # role name -> Dask future of its task
        self.dask_spec = dask_spec
        self.result = None
        self.rounds = 0  # feed() calls so far

    def as_dict(self):
        return self.coordinator.training_spec() or self.coordinator.spec()

    @property
    def phase(self):
        return "done" if self.result is not None else self.coordinator.phase

    @property
    def training(self):
        """True while the stop rule has not held (and no role has failed)."""
        if self.result is not None:
            return False
        self.check()
        return self.coordinator.phase in ("starting", "training")

    @property
    def scores(self):
        """The validation losses so far, oldest first (the seed's ``scores.data``)."""
        if self.result is not None:
            return [s["loss"] for s in self.result["scores"]]
        return [s["loss"] for s in self.coordinator.scores()]

    def follow_scores(self, timeout_s=None):
        """Iterates over the scores channel: the newest 10, then each new one until the end."""
        return _scores(self.coordinator.endpoint, follow=True, timeout_s=timeout_s,
                       **(_curve_arguments(self.coordinator) or {}))

    def state(self):
        return self.coordinator.state()

    def check(self):
        """Raises the error of the first role task that failed (the engine's message), or says
        which parameter server or scorer lost its Dask worker. A Tandem worker that lost its
        Dask worker is only left out from then on (the run goes on with the others, as
        tandem launch's does); with none left, that is an error too."""
        for name, future in self.futures.items():
            if future.status == "error":
                if self.coordinator.phase not in ("done", "failed"):
                    self.coordinator.fail(f"{name} failed: {future.exception()}")
                future.result()  # raises it
            if future.status == "cancelled":
                raise Error(f"the Dask task of {name} was cancelled")
        departed = self.departed()
        for name, address in departed.items():
            if not name.startswith("worker"):
                why = (f"{name}'s Dask worker {address} has left the cluster (its process "
                       "died?); the run cannot go on without it")
                if self.coordinator.phase not in ("done", "failed"):
                    self.coordinator.fail(why)
                raise Error(why)
        if self.coordinator.phase in ("starting", "training") and \
                all(f"worker{i}" in departed for i in range(len(self.dask_spec["worker"]))):
            why = "every Tandem worker's Dask worker has left the cluster (their processes died?)"
            self.coordinator.fail(why)
            raise Error(why)

    def role_addresses(self):
        """{role name: the address of the Dask worker that runs it}."""
        return {f"{kind}{i}": address for kind, where in self.dask_spec.items()
                for i, address in enumerate(where)}

    def departed(self):
        """{role name: address} of the roles whose Dask worker has left the cluster before the
        role's task ended: the task, bound to that address, would wait for it for ever (a nanny
        restarts a killed worker at another address)."""
        alive = set(self.client.nthreads())
        return {name: address for name, address in self.role_addresses().items()
                if address not in alive and not self.futures[name].done()}

    def wait(self, bound, timeout=None):
        """Waits for Dask futures bound to workers, `bound` a list of (future, address),
        checking the roles every second (a role's error is raised). Returns the futures whose
        Dask worker has left the cluster: they would never run, and are cancelled.
        TimeoutError after `timeout` seconds (None: no end)."""
        from distributed import wait as dask_wait

        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(bound)
        lost = []
        while pending:
            try:
                dask_wait([f for f, _ in pending], timeout=1)
            except (TimeoutError, asyncio.TimeoutError):
                pass
            self.check()
            alive = set(self.client.nthreads())
            stranded = [f for f, address in pending if not f.done() and address not in alive]
            if stranded:
                self.client.cancel(stranded)
                lost += stranded
            pending = [(f, a) for f, a in pending if not f.done() and a in alive]
            if pending and deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} Dask tasks of the run still running after "
                                   f"{timeout} s")
        return lost

    def __repr__(self):
        return f"TandemCluster({self.coordinator.endpoint}, phase={self.phase})"


def _advertised_bind(addresses):
    """Where the coordinator listens: loopback when every Dask worker is on this machine's
    loopback, else every interface, advertised as the address that routes to the workers."""
    hosts = {_host_of(a) for a in addresses}
    if hosts <= {"127.0.0.1", "localhost"}:
        return "tcp://127.0.0.1:*", ""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((next(iter(hosts)), 9))  # no packet is sent: only the route is looked up
        return "tcp://0.0.0.0:*", probe.getsockname()[0]
    finally:
        probe.close()


def _as_futures(client, values):
    """Dask collections are computed on the cluster, in one compute: collections that share a
    graph (one loader feeding images and labels) then run it once, their rows still paired;
    arrays and futures pass as they are."""
    values = list(values)
    lazy = [i for i, v in enumerate(values) if v is not None and hasattr(v, "__dask_graph__")]
    if lazy:
        for i, future in zip(lazy, client.compute([values[i] for i in lazy])):
            values[i] = future
    return values


def start(client, ps=1, worker=4, scorer=1, *, validation=None, target=None, max_seconds=0.0,
          queue_blocks=4, startup_timeout=60.0, heartbeat_timeout=5.0, dask_workers=None,
          **settings):
    """Starts Tandem's roles inside the Dask cluster, one role per Dask worker process.

    validation: (images, labels) for the scorer (arrays, dask arrays or futures); without it the
        run's settings must name a store (``data=...``) whose validation split is scored.
    target: training stops once the validation loss (summed, the seed's score) is below it.
    queue_blocks: blocks each Tandem worker queues before feeding waits (0: no limit).
    settings: the run's settings (batch, lr, model "784-100-10", ps_mode, backend, ...).

    Returns (cluster, dask_spec): the TandemCluster and, for each kind of role, the Dask worker
    addresses that run them (the seed's ``(tf_spec, dask_spec)``).
    """
    for name, count in (("ps", ps), ("worker", worker)):
        if count < 1:
            raise InputError(f"start needs at least one {name}, not {count}")
    if scorer < 0:
        raise InputError(f"scorer must be >= 0, not {scorer}")
    if scorer and validation is None and not settings.get("data"):
        raise InputError("the scorer needs rows to score on: validation=(images, labels), or a "
                         "store with a validation split (data=PATH)")
    if validation is not None and (not isinstance(validation, (tuple, list))
                                   or len(validation) != 2):
        raise InputError(f"validation must be (images, labels), not {type(validation).__name__}")
    # Scored, no rows gave a loss of 0, which met any target: the run stopped at once.
    if validation is not None and getattr(validation[1], "shape", (None,))[:1] == (0,):
        raise InputError("validation has no rows: no loss can be scored on them, and a loss of 0 "
                         "would meet any target")
    # A string is a sequence of characters: its letters were taken for addresses.
    if isinstance(dask_workers, str):
        raise InputError(f"dask_workers must be a list of worker addresses, not a string "
                         f"({dask_workers!r}): give [{dask_workers!r}]")
    addresses = sorted(dask_workers if dask_workers is not None else client.nthreads())
    # One role per Dask worker process: a worker named twice would run two roles of the run,
    # the second taking the first's place in its process (feeding then found no worker).
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise InputError(f"dask_workers names {', '.join(repeated)} more than once; each runs "
                         "one role")
    needed = ps + worker + scorer
    if len(addresses) < needed:
        raise InputError(f"start(ps={ps}, worker={worker}, scorer={scorer}) runs one role per Dask "
                         f"worker process and needs {needed}; the cluster has {len(addresses)}")
    plugin = _role_stopper()
    if hasattr(client, "register_plugin"):
        client.register_plugin(plugin)
    else:  # distributed before 2023.9
        client.register_worker_plugin(plugin)
    dask_spec = {"ps": addresses[:ps], "worker": addresses[ps:ps + worker],
                 "scorer": addresses[ps + worker:needed]}
    settings = dict(settings, fed=True)
    bind, advertise = _advertised_bind(addresses)
    coordinator = Coordinator(settings, ps=ps, workers=worker, scorers=scorer,
                              target=target or 0.0, max_seconds=max_seconds, bind=bind,
                              advertise_host=advertise, startup_timeout_s=startup_timeout,
                              heartbeat_timeout_s=heartbeat_timeout)
    futures = {}
    run = uuid.uuid4().hex[:8]
    try:  # from here on a failure must not leave the coordinator (its sockets) open
        validation = None if validation is None else tuple(_as_futures(client, validation))
        curve = _curve_arguments(coordinator)
        for kind, where in dask_spec.items():
            for index, address in enumerate(where):
                name = f"{kind}{index}"
                coordinator.expect(name, f"a task on the Dask worker {address}")
                futures[name] = client.submit(
                    _role_task, kind, coordinator.endpoint, name, queue_blocks,
                    validation if kind == "scorer" else None, curve, run,
                    key=f"tandem-{name}-{run}",
                    workers=[address], allow_other_workers=False, pure=False)
        cluster = TandemCluster(client, coordinator, futures, dask_spec, run)
        deadline = time.monotonic() + startup_timeout + 5
        while coordinator.wait_for("training", 0.2) == "starting":
            cluster.check()
            if time.monotonic() > deadline:
                break
        cluster.check()
        if coordinator.phase == "failed":
            raise Error(coordinator.failure)
        return cluster, dask_spec
    except BaseException:
        _abandon(coordinator, futures)
        raise


def _abandon(coordinator, futures):
    """After a failed start: every role is told to stop, and their tasks end."""
    if coordinator.phase not in ("done", "failed"):
        coordinator.fail("the start was abandoned")
    # 30 s for all of them, not each: a task on a Dask worker that is gone never ends, and each
    # such role cost its own 30 s.
    deadline = time.monotonic() + 30
    for future in futures.values():
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - the start's own error is the one reported
            pass
    coordinator.close()


def _placement(client, batches, workers, rotation=0):
    """A Tandem worker for each batch: where its data already is when that keeps the shares
    even, otherwise the worker with the fewest batches (ties broken in an order that rotates
    from call to call, so the odd blocks of a round do not always go to the same worker)."""
    share = math.ceil(len(batches) / len(workers))
    n = len(workers)
    workers = workers[rotation % n:] + workers[:rotation % n]
    load = {w: 0 for w in workers}
    where = {}
    keys = [b.key for b in batches if hasattr(b, "key")]
    if keys:
        where = {k: set(v) for k, v in client.who_has(keys).items()}
    placement = []
    for b in batches:
        holders = [w for w in where.get(getattr(b, "key", None), ()) if w in load and load[w] < share]
        chosen = holders[0] if holders else min(workers, key=lambda w: load[w])
        load[chosen] += 1
        placement.append(chosen)
    return placement


def _one_pair(batches):
    """Whether `batches` is one (images, labels) pair where a list of them goes: its images
    were taken for a block, and failed inside a Dask task as "too many values to unpack". An
    array's type has ndim (NumPy's, Dask's); a Delayed block's does not (asked, it would give a
    Delayed)."""
    if not isinstance(batches, (tuple, list)) or len(batches) != 2:
        return False
    first = batches[0]
    return hasattr(type(first), "ndim") and first.ndim >= 2


def feed(batches, cluster, wait=True, timeout_s=None):
    """Hands blocks of (images, labels) to the Tandem workers, in their own processes.

    batches: Dask futures (``client.compute(list_of_delayed)``) or delayed objects of
        (images, labels) pairs, or the pairs themselves. Each block goes to the Tandem worker in
        the Dask worker process that holds it, when that keeps the shares even. The worker reads
        uint8/float32 C-contiguous arrays where they lie (no copy) until it has trained on them.
    wait: wait until every block is queued (raising a failed role's error); a block whose
        Tandem worker's Dask worker left the cluster (its process died) before the block was
        queued is given to another worker, and the run goes on without the one that left.
    Returns the Dask futures of the transfers (each gives {rows, pixels_copied, ...}).
    """
    if _one_pair(batches):
        raise TypeError("feed takes a list of (images, labels) blocks; for one block, give "
                        "[(images, labels)]")
    cluster.check()
    client = cluster.client
    batches = _as_futures(client, batches)
    transfers = [None] * len(batches)  # (future, the Dask worker it is bound to)
    unqueued = list(range(len(batches)))  # blocks not yet queued by a live worker
    while unqueued:
        alive = set(client.nthreads())
        workers = [w for w in cluster.dask_spec["worker"] if w in alive]
        if not workers:
            raise Error("no Tandem worker is left to feed: their Dask workers have left the "
                        "cluster")
        placed = _placement(client, [batches[i] for i in unqueued], workers, cluster.rounds)
        cluster.rounds += 1
        for i, w in zip(unqueued, placed):
            transfers[i] = (client.submit(_transfer, batches[i], timeout_s, cluster.run_id,
                                          workers=[w],
                                          allow_other_workers=False, pure=False), w)
        if not wait:
            break
        # A block whose Tandem worker's process died before it was queued goes to another.
        lost = {f.key for f in cluster.wait([transfers[i] for i in unqueued])}
        unqueued = [i for i in unqueued if transfers[i][0].key in lost]
    futures = [f for f, _ in transfers]
    if wait:
        for f in futures:
            if f.status == "error":
                f.result()
    return futures


def stop(cluster, timeout=60.0):
    """Ends the run: training stops (if the stop rule has not stopped it), the final parameters
    are pulled from the servers, the servers exit and every role's task finishes. The Dask
    workers stay usable. Raises the error of a role that failed.

    Returns {stop_reason, scores, model (tandem.Model, the servers' final parameters; None when
    the run was stopped before its chief worker initialised them), roles}; a role whose Dask
    worker left the cluster is in roles as {name, lost}.
    """
    if cluster.result is not None:
        return cluster.result
    c = cluster.coordinator
    try:
        if c.phase in ("starting", "training"):
            c.request_stop("requested")
        c.wait_for("draining", timeout)
        c.wait_workers_gone(timeout)
        model = None
        if c.phase != "failed":
            model = c.pull_model()
            c.finish()
            c.wait_servers_gone(timeout)
        # A role whose Dask worker left (its process died) never ends its task: said, not
        # waited for.
        addresses = cluster.role_addresses()
        lost = {f.key for f in cluster.wait([(cluster.futures[name], addresses[name])
                                             for name in cluster.futures], timeout)}
        roles = cluster.client.gather([f for f in cluster.futures.values() if f.key not in lost])
        roles += [{"name": name, "lost": f"its Dask worker {addresses[name]} left the cluster"}
                  for name, f in cluster.futures.items() if f.key in lost]
        if c.phase == "failed":
            raise Error(c.failure)
        cluster.result = {"stop_reason": c.stop_reason, "scores": c.scores(), "model": model,
                          "roles": roles, "state": c.state()}
        return cluster.result
    finally:
        if cluster.result is None:
            _abandon(c, cluster.futures)
        else:
            c.close()
