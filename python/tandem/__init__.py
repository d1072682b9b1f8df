"""Tandem: train models with parameter servers, on CPUs and GPUs.

The native engine (``tandem._tandem``) with its roles running on native threads, and
``tandem.dask`` to deploy them inside a Dask cluster and feed them from dask arrays::

    import tandem
    model, summary = tandem.train((images, labels), validation=(val_images, val_labels))
    for score in tandem.scores(coordinator_address):
        print(score["loss"])
"""

import os as _os
import warnings as _warnings


def _mapped_ranges():
    """The address ranges this process has mapped, or None when that cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as maps:  # bytes: a file's name may be any bytes
            ranges = []
            for line in maps:
                low, _, high = line.split(b" ", 1)[0].partition(b"-")
                ranges.append((int(low, 16), int(high, 16)))
            return ranges
    except (OSError, ValueError):
        return None


# Before Tandem loads OpenBLAS: whether another library (Debian's numpy or torch, which use the
# same libopenblas) had it loaded is known once Tandem's is, by its address (_choose_blas_kernels):
# an address says which mapping, whatever the file was renamed or replaced by since (an upgrade
# under a long-running kernel). A numpy wheel's own copy (libopenblas64_p-r0-...so) is another
# library, with its own kernel table, at another address.
_mapped_before = _mapped_ranges()

from ._tandem import (  # noqa: E402, F401
    Coordinator,
    Error,
    InputError,
    Model,
    ParameterServerRole,
    Role,
    ScorerRole,
    WorkerRole,
    __version__,
    keygen,
    load,
    scores,
    train,
)


def _choose_blas_kernels():
    """The tandem binary's OpenBLAS kernels here too (engine/src/blas_kernels.h): where OpenBLAS
    loaded kernels older than the CPU (its choice on a CPU model newer than the library), the
    best family kernels the CPU runs, so that Python's results are the binary's bits. Switched
    only when Tandem loaded OpenBLAS itself: another library's (numpy's, torch's) call in flight
    on another thread would see its kernel table change under it. Otherwise a warning says how
    to choose them at start. A set OPENBLAS_CORETYPE stands."""
    if "OPENBLAS_CORETYPE" in _os.environ:
        return
    loaded, better = _tandem._blas_kernels()
    if not better:
        return
    address = _tandem._blas_library()
    if _mapped_before is None or not address:
        why = "tandem could not tell whether another library uses it too"
    elif any(low <= address < high for low, high in _mapped_before):
        why = "another library loaded it before tandem (numpy or torch)"
    else:
        warning = _tandem._use_better_blas_kernels()
        if not warning:
            _os.environ["OPENBLAS_CORETYPE"] = better  # Python's view, for the processes it starts
            return
        why = None
    if why is not None:
        warning = (f"OpenBLAS runs its '{loaded}' kernels, several times slower than its "
                   f"'{better}' ones this CPU runs, and {why}: set OPENBLAS_CORETYPE={better} "
                   "before starting Python")
    _warnings.warn(warning, RuntimeWarning, stacklevel=3)


from . import _tandem  # noqa: E402

_choose_blas_kernels()


def _model_from_state(layers, parameters):
    """A pickled Model made again (Model.__reduce__: pickle calls this by its name)."""
    model = Model(layers)
    model.set_parameters(parameters)
    return model


__all__ = [
    "Coordinator", "Error", "InputError", "Model", "ParameterServerRole", "Role", "ScorerRole",
    "WorkerRole", "keygen", "load", "scores", "train",
]
