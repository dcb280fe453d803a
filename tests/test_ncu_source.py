"""bench/ncu_source.py on a hand-written export in the layout of `ncu --page source --csv
--print-source cuda,sass`: source lines are read per file with their samples and stall reasons,
the SASS rows under them are not counted again."""

from __future__ import annotations

import csv

from bench.ncu_source import source_lines

HEADER = ["Line No", "Source", "Address", "Source", "Warp Stall Sampling (All Samples)", "# Samples",
          "stall_long_sb", "stall_barrier", "stall_long_sb (Not Issued)"]


def write_export(path, files):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        for name, rows in files:
            w.writerow(["File Path", f"/src/kog/{name}"])  # ncu writes the absolute path it profiled from
            w.writerow(["Function Name", "kog_decode"])
            w.writerow(HEADER)
            for row in rows:
                w.writerow(row)


def test_source_lines_carry_their_samples_and_stall_reasons(tmp_path):
    export = tmp_path / "r.csv"
    write_export(export, [
        ("decode_ring.cuh", [
            ["94", "const uint4* slot = ...;", "-", "-", "700", "700", "690", "10", "5"],
            ["", "", "0x7f00", "DEPBAR.LE SB0, 0x3", "650", "650", "640", "10", "5"],  # its SASS: not a line
            ["", "", "...", "...", "-", "-", "-", "-", "-"],
            ["95", "// a comment", "-", "-", "-", "-", "-", "-", "-"],  # no samples: skipped
        ]),
        ("decode_sync.cuh", [
            ["119", "const bool all = __syncthreads_and(ok);", "-", "-", "300", "300", "0", "300", "0"],
        ]),
    ])
    rows = source_lines(export)
    assert [(r[0], r[1], r[2]) for r in rows] == [(700, "decode_ring.cuh", 94), (300, "decode_sync.cuh", 119)]
    assert rows[0][4] == {"long_sb": 690, "barrier": 10}  # the not-issued column is left out
    assert rows[1][3] == "const bool all = __syncthreads_and(ok);"
