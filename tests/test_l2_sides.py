"""The L2 partitions' map (engine/backends/l2_sides.py): the decisions it takes from timings, on the CPU.
(The timings themselves, and the decode kernel's use of the map, are GPU tests: tests/test_cuda_backend.py.)"""

import numpy as np

from engine.backends.l2_sides import _near_far, paired_map


def test_two_levels_are_found_and_one_level_is_not_split():
    rng = np.random.default_rng(0)
    near, far = _near_far(np.r_[rng.normal(310, 6, 300), rng.normal(500, 6, 300)])
    assert abs(near - 310) < 3 and abs(far - 500) < 3
    near, far = _near_far(rng.normal(310, 6, 600))
    assert far - near < 60  # below MIN_GAP: no partitions


def test_pairs_split_between_the_sides_make_the_copies():
    # as seen from a multiprocessor on side 1: near chunks (0) are side 1's
    sides = np.array([0, 1, 1, 0, 0, 0, 1, 0, -1, 1, 1, 0])
    m = paired_map(sides, mapper_side=1, chunks=4)
    # pairs (0,1), (2,3), (6,7), (10,11) are split; (4,5) is not, (8,9) has an unclear chunk
    assert m.tolist() == [[1, 2, 6, 10], [0, 3, 7, 11]]
    absolute = sides ^ 1
    assert (absolute[m[0]] == 0).all() and (absolute[m[1]] == 1).all()
    assert ((m[0] ^ 1) == m[1]).all()  # the kernel finds the other copy's word by an xor


def test_too_few_split_pairs_leave_the_map_unsided():
    assert paired_map(np.array([0, 0, 1, 1, 0, 1]), mapper_side=0, chunks=2) is None
