"""bench/sass_audit.py on hand-written listings in nvdisasm's format: loads in series are found,
loads issued together are not."""

from __future__ import annotations

from bench.sass_audit import serial_loads

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
