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


def _mapped_files():
    """The files this process has mapped (shared libraries among them), by real path; None when
    that cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps
                    if len(line.split(None, 5)) == 6}
    except OSError:
        return None


# Before Tandem loads OpenBLAS: whether another library (Debian's numpy or torch, which use the
# same libopenblas) loaded it first is known once Tandem's is (_choose_blas_kernels). A numpy
# wheel's own copy (libopenblas64_p-r0-...so) is another file, with its own kernel table.
_mapped_before = _mapped_files()

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
    library = _tandem._blas_library()
    shared = _mapped_before is None or not library or library in _mapped_before
    if not shared:
        warning = _tandem._use_better_blas_kernels()
        if not warning:
            _os.environ["OPENBLAS_CORETYPE"] = better  # Python's view, for the processes it starts
            return
    else:
        warning = (f"OpenBLAS runs its '{loaded}' kernels, several times slower than its "
                   f"'{better}' ones this CPU runs, and another library loaded it before tandem "
                   f"(numpy or torch): set OPENBLAS_CORETYPE={better} before starting Python")
    _warnings.warn(warning, RuntimeWarning, stacklevel=3)


from . import _tandem  # noqa: E402

_choose_blas_kernels()

__all__ = [
    "Coordinator", "Error", "InputError", "Model", "ParameterServerRole", "Role", "ScorerRole",
    "WorkerRole", "keygen", "load", "scores", "train",
]
