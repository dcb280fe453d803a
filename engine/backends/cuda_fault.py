"""What a device fault leaves behind, and how the process lives with it.

A fault inside a kernel (a bad address) is sticky: the process's CUDA context is gone, and
every CuPy object on it fails again when it is freed. The CUDA backend reports the fault once,
as a KogError (engine/backends/cuda.py); this module keeps the aftermath quiet: the failing
destructors print nothing, and the `kog` command leaves without Python's teardown.
"""

from __future__ import annotations

import os
import sys

_faulted = False  # a device fault has ended this process's CUDA context


def mark() -> None:
    """A device fault happened: from now on CuPy's failing destructors are dropped."""
    global _faulted
    _faulted = True
    _quiet_cuda_teardown()


def end_process_after_fault(code: int) -> None:
    """Exit now, skipping Python's teardown, if a device fault has ended the CUDA context: the
    teardown frees CuPy's objects on the dead context, and each failed free prints a traceback
    that no hook catches that late. Returns if there was no fault."""
    if _faulted:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _quiet_cuda_teardown() -> None:
    """CuPy's destructors (events, modules) fail one by one on a dead context, each printing a
    traceback (through sys.unraisablehook, or sys.excepthook from Cython) that says nothing the
    KogError did not: drop those."""
    if getattr(sys.unraisablehook, "kog_quiet", False):
        return
    cuda_errors = frozenset(("CUDARuntimeError", "CUDADriverError"))

    # nothing raised, and no globals or builtins: a hook may run while the interpreter stops
    def unraisable(u, previous=sys.unraisablehook, cuda_errors=cuda_errors):
        try:
            if u.exc_type.__name__ not in cuda_errors:
                previous(u)
        except:  # noqa: E722
            pass

    def excepthook(kind, value, tb, previous=sys.excepthook, cuda_errors=cuda_errors):
        try:
            if kind.__name__ not in cuda_errors:
                previous(kind, value, tb)
        except:  # noqa: E722
            pass

    unraisable.kog_quiet = True
    sys.unraisablehook, sys.excepthook = unraisable, excepthook
