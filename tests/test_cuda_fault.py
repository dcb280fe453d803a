"""After a device fault: CuPy's failing destructors print nothing, the process ends at once.

Runs on the CPU machine: a stand-in object whose destructor raises an error of CuPy's class
name plays the part of CuPy's events and modules on a dead CUDA context. (The fault itself is
made on the GPU: tests/test_cuda_backend.py::test_device_fault_is_an_error_not_a_hang.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import sys
from engine.backends import cuda_fault

class CUDARuntimeError(RuntimeError):
    pass

class DeadEvent:
    def __del__(self):
        raise CUDARuntimeError("cudaErrorMisalignedAddress: misaligned address")

class Broken:
    def __del__(self):
        raise ValueError("not a CUDA error")

if sys.argv[1] == "fault":
    cuda_fault.mark()
DeadEvent()  # freed at once: its error goes to sys.unraisablehook
kept = DeadEvent()  # freed in the teardown, if there is one
Broken()
print("before the end", flush=True)
cuda_fault.end_process_after_fault(3)
print("went on")
"""


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_after_a_fault_cuda_errors_are_quiet_and_the_process_ends():
    run = _run("fault")
    assert run.returncode == 3 and run.stdout == "before the end\n"
    assert "CUDARuntimeError" not in run.stderr
    assert "ValueError: not a CUDA error" in run.stderr  # other errors still show


def test_without_a_fault_nothing_changes():
    run = _run("none")
    assert run.returncode == 0 and run.stdout == "before the end\nwent on\n"
    assert "CUDARuntimeError: cudaErrorMisalignedAddress" in run.stderr
