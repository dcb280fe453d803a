"""Global loads that ptxas put in series: a load whose value is used before the next global load
of the same basic block issues, so the two cost two round trips instead of one (PERF.md session
14: the Llama shape's act copy, the two-word tagged gathers on Qwen2.5 and SmolLM2). With
--spills, instead: the local-memory stores and loads (register spills, or local arrays) per
source line, counted where they sit in the code, not how often they run: whether they land on a
hop's path (PERF.md session 21: spills in the act copy, ~3% on Llama).

    nvcc -arch=sm_90 -std=c++17 -cubin -lineinfo -DKOG_...=... kernels/decode.cu -o k.cubin
    python3 bench/sass_audit.py k.cubin [--spills] [--nvdisasm PATH]

nvdisasm comes with the CUDA toolkit (the CPU machine's lacks it; the triton wheel carries one:
`pip download --no-deps triton`, then triton/backends/nvidia/bin/nvdisasm). Each line printed is
how often the pattern occurs, the source line of the load, where its value is first used, and the
source line of the global load that had to wait for that use. Some are real dependences (a pointer
loaded, then the data it points to); the rest are candidates for keeping the loads together.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter

_SOURCE = re.compile(r'\s*//## File "(.*?)", line (\d+)')
_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_GUARD = re.compile(r"^@!?U?P\w+\s+")
_REGISTER = re.compile(r"\bR(\d+)\b")


def _opcode_and_operands(text: str) -> tuple[str, list[str]]:
    body = _GUARD.sub("", text.strip())
    opcode, _, rest = body.partition(" ")
    return opcode, [part.strip() for part in rest.split(",")] if rest else []


def _is_global_load(opcode: str) -> bool:
    return opcode.startswith(("LDG", "LD."))


def _written(opcode: str, operands: list[str]) -> list[int]:
    """The registers a load writes: its first operand, widened by the access size."""
    first = _REGISTER.match(operands[0]) if operands else None
    if not first:
        return []
    width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
    return list(range(int(first.group(1)), int(first.group(1)) + width))


def _read(opcode: str, operands: list[str]) -> set[int]:
    """The registers an instruction reads (stores read every operand; others all but the first)."""
    sources = operands if opcode.startswith(("ST", "RED", "ATOM")) else operands[1:]
    return {int(r) for part in sources for r in _REGISTER.findall(part)}


def basic_blocks(listing: str) -> list[list[tuple[str, str]]]:
    """(instruction text, source line) per instruction, split at every label."""
    blocks: list[list[tuple[str, str]]] = [[]]
    where = "?"
    for line in listing.splitlines():
        source = _SOURCE.match(line)
        if source:
            where = f"{source.group(1).rsplit('/', 1)[-1]}:{source.group(2)}"
        elif line.strip().startswith(".L"):
            blocks.append([])
        else:
            instruction = _INSTRUCTION.match(line)
            if instruction:
                blocks[-1].append((instruction.group(2), where))
    return [block for block in blocks if block]


def serial_loads(listing: str) -> Counter:
    """(load's line, first use's line, next load's line) -> how often a load's value is used
    before the next global load of its basic block issues."""
    found: Counter = Counter()
    for block in basic_blocks(listing):
        pending: dict[int, str] = {}  # register -> source line of the load still filling it
        for i, (text, where) in enumerate(block):
            opcode, operands = _opcode_and_operands(text)
            used = _read(opcode, operands)
            waited = {pending.pop(r) for r in used & pending.keys()}
            if waited:
                later = next((w for t, w in block[i + 1:] if _is_global_load(_opcode_and_operands(t)[0])), None)
                if later is not None:
                    for load in waited:
                        found[(load, where, later)] += 1
            if _is_global_load(opcode):
                for r in _written(opcode, operands):
                    pending[r] = where
    return found


def _in_order(where: str) -> tuple[str, int]:
    """'file:line' sorted by file, then line number ('?' first)."""
    file, _, line = where.rpartition(":")
    return (file, int(line)) if line.isdigit() else ("", 0)


def spills(listing: str) -> Counter:
    """(STL or LDL, source line) -> how many local-memory stores / loads (spills, local arrays) ptxas put there."""
    found: Counter = Counter()
    for block in basic_blocks(listing):
        for text, where in block:
            opcode = _opcode_and_operands(text)[0]
            if opcode.startswith(("STL", "LDL")):
                found[(opcode[:3], where)] += 1
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubin", help="a cubin built with -lineinfo")
    ap.add_argument("--spills", action="store_true", help="list the register spills per source line instead")
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm"), help="the disassembler (default: from PATH)")
    args = ap.parse_args(argv)
    if not args.nvdisasm:
        print("sass_audit: no nvdisasm on PATH; pass --nvdisasm PATH", file=sys.stderr)
        return 2
    run = subprocess.run([args.nvdisasm, "-g", "-c", args.cubin], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        print(f"sass_audit: nvdisasm failed: {run.stderr.strip().splitlines()[-1] if run.stderr.strip() else run.returncode}",
              file=sys.stderr)
        return 2
    if args.spills:
        for (kind, where), n in sorted(spills(run.stdout).items(), key=lambda item: (_in_order(item[0][1]), item[0][0])):
            print(f"{n:4d}  {kind}  {where}")
        return 0
    for (load, use, later), n in serial_loads(run.stdout).most_common():
        print(f"{n:4d}  load {load}  used at {use}  before the next load {later}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
