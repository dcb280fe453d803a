// The seam between two launches of the decode kernel queued back to back on one stream (a drafted decode's switch
// of builds, engine/backends/cuda.py): it runs after the first launch has ended and before the second starts, and
// sets the second up to go on from where the first stopped, so that no host work sits between the two.
#include "portability.cuh"
#include "decode_status.cuh"

// `status`, `from_ints` (its KParams' first integers: start_pos, max_tokens) and `tokens` (host-mapped) are the first
// launch's. Where it stopped at the host's cancel, the second launch starts where the first's feeding ended, may emit
// the tokens left plus one, and finds logits that are -inf but at the first launch's last token, which was never fed:
// its first step picks that token again (the host does not yield it twice) and feeds it. Where the first launch ended
// otherwise (a stop id, the length, the context, an error), the second gets max_tokens 1 and no finite logit: it emits
// one token, feeds nothing, and the host drops it. `copy_fed` (the first launch ran the plain build): its fed tokens
// go into context_ids at their positions, where the drafts' build's search reads them (that build writes its own).
extern "C" __global__ void kog_hand_over(const int* status, const long long* from_ints, long long* to_ints,
                                         const int* tokens, int copy_fed, int* context_ids, float* logits, int vocab) {
    __shared__ int s_token, s_fed;
    if (threadIdx.x == 0) {
        const bool goes_on = status[ST_ERROR] == 0 && status[ST_REASON] == R_CANCEL;  // (after a token: ST_OUT >= 1)
        s_token = goes_on ? kog_ld_sys_s32(tokens + status[ST_OUT] - 1) : -1;
        s_fed = goes_on && copy_fed ? status[ST_FED] : 0;
        if (blockIdx.x == 0) {
            to_ints[0] = from_ints[0] + status[ST_FED];
            to_ints[1] = goes_on ? from_ints[1] - status[ST_OUT] + 1 : 1;
        }
    }
    __syncthreads();
    const int token = s_token, fed = s_fed, start = (int)from_ints[0];
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    for (int i = first; i < vocab; i += stride) logits[i] = i == token ? 0.f : -KOG_INF;
    for (int i = first; i < fed; i += stride) context_ids[start + i] = kog_ld_sys_s32(tokens + i);
}
