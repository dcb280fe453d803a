"""bench/sass_audit.py on hand-written listings in nvdisasm's format: loads in series are found,
loads issued together are not; register spills are counted per source line."""

from __future__ import annotations

from bench.sass_audit import serial_loads, spills

HEADER = '\t//## File "/k/decode_sync.cuh", line {}\n'


def listing(*lines: tuple[int, str]) -> str:
    return "".join(HEADER.format(src) + f"        /*{16 * i:04x}*/                   {ins} ;\n"
                   for i, (src, ins) in enumerate(lines))


def test_a_load_used_before_the_next_load_is_found():
    text = listing((291, "LDG.E.128.STRONG.GPU R152, desc[UR26][R6.64]"),
                   (294, "STS.128 [R8], R152"),
                   (291, "@!P0 LDG.E.128.STRONG.GPU R148, desc[UR26][R6.64+0x1800]"),
                   (294, "STS.128 [R9], R148"))
    assert serial_loads(text) == {("decode_sync.cuh:291", "decode_sync.cuh:294", "decode_sync.cuh:291"): 1}


def test_loads_issued_together_and_a_label_between_are_not_found():
    together = listing((291, "LDG.E.128.STRONG.GPU R152, desc[UR26][R6.64]"),
                       (291, "LDG.E.128.STRONG.GPU R148, desc[UR26][R6.64+0x1800]"),
                       (294, "STS.128 [R8], R152"),
                       (294, "STS.128 [R9], R148"))
    assert serial_loads(together) == {}
    # a use and the next load in different basic blocks: the branch decides, not the scheduler
    split = listing((168, "LDG.E.128.STRONG.GPU R4, desc[UR28][R2.64]"),
                    (168, "ISETP.NE.AND P1, PT, R69, R7, PT")) + ".L_x_1:\n" + listing(
                        (214, "LDG.E.128.STRONG.GPU R8, desc[UR28][R12.64]"))
    assert serial_loads(split) == {}


def test_spills_are_counted_per_source_line():
    text = listing((317, "STL.128 [R1+0x10], R152"),
                   (317, "@!P0 STL.64 [R1+0x20], R148"),
                   (134, "LDL.128 R152, [R1+0x10]"),
                   (134, "LDS.128 R8, [R9]"),
                   (134, "STS.128 [R8], R152"))
    assert spills(text) == {("STL", "decode_sync.cuh:317"): 2, ("LDL", "decode_sync.cuh:134"): 1}
