// A decode launch's status words and stop reasons: the decode kernel writes them, the hand-over kernel
// (hand_over.cu) and the host (engine/backends/cuda.py) read them.
#pragma once

enum { ST_ERROR = 0, ST_OUT = 1, ST_FED = 2, ST_REASON = 3, ST_APPROX = 4, ST_WHERE = 5, ST_BLOCK = 6, ST_PASSES = 7 };
enum { ERR_TIMEOUT = 1, ERR_BAD_ARGS = 3 };
enum { R_STOP = 1, R_LENGTH = 2, R_CONTEXT = 3, R_CANCEL = 4 };
