"""The CUDA backend: a batched prefill (kernels/prefill.cu) and the decode monokernel (kernels/decode.cu).

Load time does all the offline work once: weights go to the GPU in bf16 in the layouts the
kernel streams (per layer: packed Q/K/V rows, O, gate/up rows interleaved, down in the kernel's
column slices; then the embedding and an untied LM head), the small fp32 vectors (norm weights,
QKV bias) beside them, RoPE tables for every position, and an fp32 KV cache of `max_context`
positions.

`prefill` (engine/backends/cuda_prefill.py) runs the prompt with fp32 activations through
tensor-core products of split-bf16 terms and fused kernels: the CPU reference's math to within
fp32 rounding; it writes the KV cache.
`decode` launches ONE cooperative kernel that runs the whole sample -> forward loop on the
GPU and writes each token into pinned, host-mapped memory; this generator polls that memory
(engine/backends/token_wait.py: how and when to look) and yields tokens while the kernel runs. A drafted
decode that switches between the plain build and the drafts' build queues the next launch behind the running
one, with a small kernel between them (kernels/hand_over.cu) that sets it up from how the first ended.
Cancel is a host-mapped flag the kernel reads once per token; every wait inside the kernel
has a watchdog, and a timeout comes back as a KogError with the device still usable. A
device fault (a bad address) ends the process's CUDA context: it comes back as a KogError too,
and every later call says so instead of failing somewhere inside CuPy.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import rope
from engine.backends import cuda_fault
from engine.backends import DRAFT_POSITIONS_MAX, check_drafts
from engine.backends.base import Backend
from engine.backends.cuda_prefill import CudaPrefill
from engine.backends.l2_sides import CHUNK_WORDS, HopSpace, hop_space
from engine.backends.token_wait import TokenWait, follow
from engine.drafts import BuildSwitch, ContextDrafts
from engine.errors import KogError
from engine.paths import cache_dir, make_dir
from engine.sampling import SamplingParams

KERNEL_DIR = Path(__file__).resolve().parent.parent.parent / "kernels"
NBINS = 1024
WATCHDOG_S = 5.0  # a single wait inside the kernel longer than this is a hang
_NOT_READY = 600  # cudaErrorNotReady: the event's work is still running
_DEBUG = {"": 0, "hang": 1, "fault": 2}  # the tests' failure knobs (kernels: DEBUG_HANG, DEBUG_FAULT)

# KParams in kernels/decode.cu, in order; every field 8 bytes
_PTR_FIELDS = (
    "w ws kc vc rcos rsin hop hop_map sm_side logits keys bins hist_cnt hist_mass slot_val slot_idx "
    "flags ctl status rep_bits stop_ids host_tokens host_cancel tok_time context_ids"
).split()
_INT_FIELDS = "start_pos max_tokens ctx_limit n_stop greedy top_k seed timeout_ns debug use_penalty".split()
_FLOAT_FIELDS = "temperature top_p min_p penalty".split()
_ERRORS = {1: "watchdog timeout", 2: "aborted after another block failed", 3: "bad launch shape"}
_R_CANCEL = 4  # a launch's stop reason: the host's cancel flag (kernels: R_CANCEL)


@dataclass
class _DecodeKernel:
    """One build of the decode kernel: the plain decode's, or the drafts' (kernels: NPOS)."""

    module: object
    function: object
    info: dict
    smem: int
    occupancy: int
    hop: HopSpace  # its hop space (its size depends on the positions a pass)


@dataclass
class _LaunchSlot:
    """What one launch of the decode kernel writes: the words it starts from zero (the blocks' flags, status, control
    words, the sampler's histograms: one allocation, one memset), its token stamps, its parameter block (and the pinned
    copy it is uploaded from) and the host-mapped token and cancel words. A backend has two, used in turn, so that a
    launch can be queued behind a running one (a drafted decode's switch of builds)."""

    words: object
    views: dict  # flags, status, ctl, hist_cnt, hist_mass: the kernel's fields in `words`
    tok_time: object
    params: object
    params_staged: np.ndarray
    h_tokens: np.ndarray  # -1 until the kernel writes the token
    h_cancel: np.ndarray
    pinned: object  # (keeps the host-mapped memory alive)

    def fields(self) -> dict[str, int]:
        """Its KParams pointers."""
        return {name: view.data.ptr for name, view in self.views.items()} | {
            "tok_time": self.tok_time.data.ptr, "host_tokens": self.h_tokens.ctypes.data,
            "host_cancel": self.h_cancel.ctypes.data}


@dataclass
class _Launch:
    """A launch of the decode kernel, queued or running. `start` and `max_tokens` are the host's, or (`repeat` set)
    the launch before it ended first and the hand-over kernel set them on the device: the host's copies follow
    from that launch's status."""

    kernel: _DecodeKernel
    slot: _LaunchSlot
    done: object  # its event
    start: int
    max_tokens: int
    leaves_logits: bool  # the logits of its last token are in place once it ends (a plain build's unscreened head)
    repeat: int | None = None  # the launch before's last token, which this one's first step emits again


class Layout:
    """Offsets of the packed weights; the same formulas as the constants in kernels/decode.cu."""

    def __init__(self, c, tied: bool):
        H, D, inter, V = c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size
        self.qd, self.kvd = c.num_heads * D, c.num_kv_heads * D
        self.nqkv = self.qd + 2 * self.kvd
        self.off_qkv = 0
        self.off_o = self.nqkv * H
        self.off_gu = self.off_o + H * self.qd
        self.off_dn = self.off_gu + 2 * inter * H
        self.lstride = self.off_dn + H * inter
        self.off_emb = c.num_layers * self.lstride
        self.off_lmh = self.off_emb if tied else self.off_emb + V * H
        self.total = self.off_lmh + V * H
        self.s_attn_norm, self.s_mlp_norm, self.s_bqkv = 0, H, 2 * H
        self.s_qnorm = 2 * H + self.nqkv
        self.s_knorm = self.s_qnorm + D
        self.sstride = self.s_knorm + D
        self.s_final = c.num_layers * self.sstride
        self.stotal = self.s_final + H
        self.off_lm8 = self.s_lmq = None

    def add_lm_screen(self, c) -> None:
        """Room for the LM head's int8 rows after the bf16 weights, and for each row's constants (s, e,
        t, 0; lm_screen_rows) after the fp32 vectors (kernels: LM_SCREEN, OFF_LM8, S_LMQ)."""
        self.off_lm8 = self.total
        self.total += c.vocab_size * c.hidden_size // 2
        self.s_lmq = (self.stotal + 3) // 4 * 4  # 16-byte rows of (s, e, t, 0)
        self.stotal = self.s_lmq + 4 * c.vocab_size


def shape_defines(c, nblk: int, tied: bool) -> dict[str, str]:
    """The decode kernel's macros for a model shape on a grid of `nblk` blocks (tests/test_kernels_compile.py
    builds every registry shape with them)."""
    f32 = lambda v: repr(float(np.float32(v))) + "f"  # noqa: E731  exact fp32 literal
    return {
        "KOG_H": str(c.hidden_size),
        "KOG_NH": str(c.num_heads),
        "KOG_NKV": str(c.num_kv_heads),
        "KOG_D": str(c.head_dim),
        "KOG_INTER": str(c.intermediate_size),
        "KOG_VOCAB": str(c.vocab_size),
        "KOG_NL": str(c.num_layers),
        "KOG_QKV_BIAS": str(int(c.qkv_bias)),
        "KOG_QK_NORM": str(int(c.qk_norm)),
        "KOG_EPS": f32(c.rms_norm_eps),
        "KOG_SCALE": f32(1.0 / np.sqrt(c.head_dim)),
        "KOG_NBLK": str(nblk),
        "KOG_TIED": str(int(tied)),
        # the hop space's two copies need a head's row in one 4 KB chunk (kernels: HOP_CHUNK)
        "KOG_HOP_COPIES": "2" if CHUNK_WORDS % c.head_dim == 0 else "1",
    }


def _cupy():
    try:
        import cupy
    except ImportError:
        raise KogError("the CUDA backend needs CuPy (pip install 'kog[cuda]')") from None
    return cupy


# The message of the static_assert that refuses a build whose shared-memory plan does not fit a block
# (kernels/decode_common.cuh: SMEM_BYTES <= SMEM_LIMIT).
SMEM_REFUSAL = "shared memory per block"


class SharedMemoryShort(KogError):
    """A kernel build refused at compile time: its shared-memory plan does not fit a block."""


def first_error(log: str) -> str:
    """A compiler log's first line that says error (its first line where none does)."""
    lines = log.strip().splitlines()
    return next((line for line in lines if "error" in line), lines[0] if lines else "")


def compile_error(first: str, message: str) -> KogError:
    """The error a failed build raises, from its log's first error: SharedMemoryShort where that is the
    shared-memory refusal (fit_positions steps over it), else KogError."""
    return (SharedMemoryShort if SMEM_REFUSAL in first else KogError)(message)


def fit_positions(asked: int, build):
    """`build(positions)` for asked, asked - 1, ..., 2 positions a pass, until one is not refused with
    SharedMemoryShort: (its positions, what it returned), or (1, None) where none fits. A drafted pass
    stages every position's product inputs and sums in shared memory: every registry shape fits five on a
    132-multiprocessor grid (Llama-3.2-3B six, the 7-8B shapes five with the LM head's sums in chunks), but
    `--drafts 8`, a smaller grid's larger shares or a GPU of less shared memory may not. A refusal comes from
    the compiler's front end, in a second or less."""
    for positions in range(asked, 1, -1):
        try:
            return positions, build(positions)
        except SharedMemoryShort:
            continue
    return 1, None


def compile_kernels(source: str, defines: dict[str, str], arch: str, kernel_dir: Path = KERNEL_DIR,
                    options: tuple[str, ...] = ()) -> Path:
    """NVRTC-compile <kernel_dir>/<source> for `arch` (e.g. '90') with extra NVRTC `options`; the
    binary is cached on disk."""
    from cupy_backends.cuda.libs import nvrtc

    src = (kernel_dir / source).read_text()
    headers = [p.read_text() for p in sorted(kernel_dir.glob("*.cuh"))]  # what the source may include
    opts = [f"-arch=sm_{arch}", "-std=c++17", f"--include-path={kernel_dir}"]
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())] + list(options)
    key = hashlib.sha256("\0".join([src, *headers, *opts, repr(nvrtc.getVersion())]).encode()).hexdigest()[:24]
    folder = cache_dir() / "kernels"
    path = folder / f"{Path(source).stem}-sm{arch}-{key}.cubin"
    if path.exists():
        return path
    prog = nvrtc.createProgram(src, source, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError:
            text = nvrtc.getProgramLog(prog)
            make_dir(folder)
            (folder / f"{Path(source).stem}-{key}.log").write_text(text)
            first = first_error(text)
            raise compile_error(first, f"compiling {source} failed: {first} (full log in {folder})") from None
        # CuPy's wrapper drops the last byte of the binary (it assumes a trailing NUL); an
        # ELF cubin ends in padding or a zero field, so put the byte back.
        binary = nvrtc.getCUBIN(prog) + b"\0"
    finally:
        nvrtc.destroyProgram(prog)
    make_dir(folder)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(binary)
    tmp.replace(path)
    return path


def lm_screen_rows(bf16_rows, xp=np):
    """The int8 screen of LM head rows given as bf16 bits ([n, H] uint16; numpy or cupy as `xp`), for
    kernels' LM_SCREEN: (q as [n, H] int8, [n, 4] float32 of (s, e, t, 0)) with q = round(w / s) and
    s = max |w| / 127 (1 for a zero row). The kernel's screened logit s (s_x V), V = q . x_q exactly
    with x_q the input in 16-bit fixed point (|x_q| <= 32,512, within 0.504 of x / s_x), lies within
    |x| e + s_x t (+ fp32's rounding below the normal floats) of any fp32 evaluation of w . x:
    - e covers |w - s q| and the exact sum's rounding (any order, H terms), with room for the rounding
      of |x| and of the bound's own products;
    - t = s |q|_1 C covers the input's quantization (0.504 s_x s |q|_1) and the screened logit's own
      fp32 roundings, each at most 2^-24 32,513 s_x s |q|_1 < 2^-9 s_x s |q|_1: the int -> float of each
      of the row's segments (one in all), the adds of up to `nseg` segments (ceil(H / 1,024): granules of
      at least 64 16-byte vectors), the two scalings and the add of the bound, with one to spare.
    Both are rounded up to the next float."""
    H = bf16_rows.shape[1]
    gamma = (H + 8) * 2.0**-24 * 1.01  # a sum of H fp32 products, against the sum of their sizes
    nseg = (H // 16 + 63) // 64  # (kernels: a static_assert holds MLM8::NSEG to it)
    c = 0.505 + (nseg + 4) * 2.0**-9
    w = (bf16_rows.astype(xp.uint32) << 16).view(xp.float32).astype(xp.float64)
    s = (xp.abs(w).max(axis=1) / 127).astype(xp.float32)
    s = xp.where(s > 0, s, xp.float32(1))
    q = xp.clip(xp.rint(w / s[:, None]), -127, 127)
    s64 = s.astype(xp.float64)
    err = xp.sqrt(((w - q * s64[:, None]) ** 2).sum(axis=1))
    e = (err + (gamma + 2.0**-22) * xp.sqrt((w**2).sum(axis=1))) * (1 + 4 * gamma)
    t = s64 * xp.abs(q).sum(axis=1) * c * (1 + 2.0**-20)
    consts = xp.zeros((len(s), 4), xp.float32)
    consts[:, 0] = s
    for k, v in ((1, e), (2, t)):
        v32 = v.astype(xp.float32)
        consts[:, k] = xp.where(v32 < v, xp.nextafter(v32, xp.float32(xp.inf)), v32)
    return q.astype(xp.int8), consts


class CudaBackend(Backend):
    name = "cuda"
    weight_bytes = 2  # bf16
    kv_bytes = 4  # fp32 cache: exact agreement with the reference first; bf16 is a later option

    def __init__(self, model, max_context: int, *, draft_positions: int = 1, defines: dict[str, str] | None = None,
                 kernel_dir: Path | None = None, nvrtc_options: tuple[str, ...] = ()):
        """`draft_positions` > 1: a greedy decode without a repetition penalty checks up to
        draft_positions - 1 draft tokens copied from the context in each pass (a second build of the
        kernel, made at load, or on first use where a test sets `draft_positions` later; the tokens are
        the plain decode's). Where that many positions do not fit a block's shared memory, the most that
        do (`pass_positions`; 1, the plain decode, where not even two fit).

        `defines` (extra kernel macros), `kernel_dir` (another version of kernels/, whose parameter
        block matches this file's) and `nvrtc_options` (extra options for the decode kernel, such as
        -lineinfo for a profiler): for experiments (bench/) only."""
        super().__init__(model.config, max_context)
        self._extra_defines = dict(defines or {})
        self._kernel_dir = kernel_dir or KERNEL_DIR
        self._nvrtc_options = tuple(nvrtc_options)
        check_drafts(draft_positions)
        self.draft_positions = draft_positions
        self._drafts: dict[int, _DecodeKernel | None] = {}  # its build for each draft_positions (_drafts_kernel)
        cp = self.cp = _cupy()
        c = self.config
        self._check_shape(c)
        self.device = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(self.device.id)
        self._device_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.arch = f"{props['major']}{props['minor']}"
        # one block per multiprocessor; KOG_NBLK in `defines` runs a smaller grid (experiments)
        self.nsm = int(props["multiProcessorCount"])
        self.nblk = int(self._extra_defines.get("KOG_NBLK", self.nsm))
        w = model.weights
        self.tied = "lm_head.weight" not in w
        self.lay = lay = Layout(c, self.tied)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._lock = threading.Lock()
        with self.device, self.stream:
            self._load_modules()
            self._upload(w, lay)
            self._alloc(lay)
            self._prefill = CudaPrefill(self, self.pmod)
        if draft_positions > 1:  # (built now, not inside the first generation's time to first token)
            self._drafts_kernel()
        self.stream.synchronize()
        self.logits_valid = False
        self.lost: str | None = None  # why the CUDA context is unusable, after a device fault
        self.last_logits: np.ndarray | None = None
        self.last_status: dict = {}
        self.token_times_ns: np.ndarray = np.zeros(0, np.uint64)
        self.switch_gaps_ns: list[int] = []  # a drafted decode's switches: the GPU's time lost to each (_finish)
        # a drafted decode runs the plain build where the text copies nothing (decode); False: the drafts' build
        # throughout (bench/ comparisons)
        self.switch_builds = True
        self._last_context: ContextDrafts | None = None  # the last drafted decode's index of its context

    # ---- load ---------------------------------------------------------------------------
    @staticmethod
    def _check_shape(c) -> None:
        problems = []
        if c.head_dim % 64 or c.head_dim > 256:
            problems.append(f"head_dim {c.head_dim} (needs 64, 128, 192 or 256)")
        if c.num_heads % c.num_kv_heads:
            problems.append("query heads not a multiple of kv heads")
        if c.hidden_size % 8 or c.intermediate_size % 8:
            problems.append("hidden/intermediate size not a multiple of 8")
        if problems:
            raise KogError(f"the CUDA backend cannot run this shape: {'; '.join(problems)}")

    def _defines(self) -> dict[str, str]:
        return shape_defines(self.config, self.nblk, self.tied) | self._extra_defines

    def _load_modules(self) -> None:
        cp = self.cp
        pre = compile_kernels("prefill.cu", {}, self.arch)
        self.pmod = cp.RawModule(path=str(pre))
        self.k_f32_to_bf16 = self.pmod.get_function("kog_f32_to_bf16")
        self.l2mod = cp.RawModule(path=str(compile_kernels("l2_sides.cu", {}, self.arch)))
        self.hand_over_mod = cp.RawModule(path=str(compile_kernels("hand_over.cu", {}, self.arch)))
        self.k_hand_over = self.hand_over_mod.get_function("kog_hand_over")
        main = self._decode_kernel(self._defines())
        self.mod, self.k_decode, self.kernel_info, self.smem = main.module, main.function, main.info, main.smem
        self.occupancy, self._main = main.occupancy, main
        if self.kernel_info["lm_screen"]:
            self.lay.add_lm_screen(self.config)
            self.greedy_bytes_saved = self.config.vocab_size * self.config.hidden_size  # bf16 rows -> int8

    def _decode_kernel(self, defines: dict[str, str]) -> _DecodeKernel:
        """A build of kernels/decode.cu, checked against this file's parameter block and layout."""
        cp = self.cp

        def load(path: Path):
            mod = cp.RawModule(path=str(path), enable_cooperative_groups=True)
            return mod, mod.get_function("kog_decode")

        dec = compile_kernels("decode.cu", defines, self.arch, self._kernel_dir, self._nvrtc_options)
        try:
            mod, fn = load(dec)
        except Exception as e:  # a stale or broken cache entry: rebuild once
            dec.unlink(missing_ok=True)
            dec = compile_kernels("decode.cu", defines, self.arch, self._kernel_dir, self._nvrtc_options)
            try:
                mod, fn = load(dec)
            except Exception:
                raise KogError(f"cannot load the decode kernel: {type(e).__name__}: {e}") from None
        info = cp.zeros(18, dtype=cp.int64)
        mod.get_function("kog_info")((1,), (32,), (info,))
        info = info.get()
        k = {
            "lstride": int(info[0]), "off_emb": int(info[1]), "off_lmh": int(info[2]), "sstride": int(info[3]),
            "s_final": int(info[4]), "smem": int(info[5]), "nthr": int(info[6]), "nblk": int(info[7]),
            "params_bytes": int(info[8]), "nbins": int(info[9]), "vpad": int(info[10]), "hop_words": int(info[11]),
            "flags": int(info[12]), "max_stop": int(info[13]), "dn_layout": int(info[14]),
            "hop_copies": int(info[15]), "lm_screen": bool(info[16]), "positions": int(info[17]),
        }
        smem = k["smem"]
        fn.max_dynamic_shared_size_bytes = smem
        want = len(_PTR_FIELDS + _INT_FIELDS + _FLOAT_FIELDS) * 8
        lay = self.lay
        mine = (lay.lstride, lay.off_emb, lay.off_lmh, lay.sstride, lay.s_final, want, self.nblk, NBINS)
        theirs = (k["lstride"], k["off_emb"], k["off_lmh"], k["sstride"], k["s_final"], k["params_bytes"],
                  k["nblk"], k["nbins"])
        if mine != theirs:
            raise KogError("kernels/decode.cu and engine/backends/cuda.py disagree on the parameter block")
        self.nthr = k["nthr"]  # threads per block (kernels: NTHR)
        try:
            from cupy_backends.cuda.api import driver

            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, self.nthr, smem)
        except Exception:  # noqa: BLE001 - the cooperative launch checks co-residency as well
            per_sm = 1
        if per_sm < 1:
            raise KogError(
                f"the decode kernel cannot keep one block on every multiprocessor "
                f"({fn.num_regs} registers, {smem} bytes shared memory)"
            )
        # the vectors that cross blocks, as tagged words (phase << 32 | fp32 bits) and summed words, placed by L2
        # partition (kernels: the hop space); zeroed per launch
        hop = hop_space(cp, self.l2mod, k["hop_words"], k["hop_copies"], self.nsm)
        return _DecodeKernel(module=mod, function=fn, info=k, smem=smem, occupancy=per_sm, hop=hop)

    def _drafts_kernel(self) -> _DecodeKernel | None:
        """The build that checks drafts (kernels: NPOS) of `draft_positions` positions a pass, or of the most
        that fit (fit_positions; None where not even two do), made once."""
        asked = self.draft_positions
        if asked not in self._drafts:
            # (down's weights are laid out in the plain build's column slices: the drafts' build reads them so)
            defines = self._defines() | {"KOG_DN_LAYOUT": str(self.kernel_info["dn_layout"])}
            with self.device, self.stream:
                positions, kernel = fit_positions(asked, lambda n: self._decode_kernel(defines | {"KOG_NPOS": str(n)}))
            self.stream.synchronize()
            if kernel is not None:
                if kernel.info["positions"] != positions:  # (a kernel_dir of another version, say)
                    raise KogError(f"the drafts' decode kernel was not built for {positions} positions a pass")
                if kernel.info["lm_screen"] != self.kernel_info["lm_screen"]:  # (its passes without a draft screen)
                    raise KogError("the drafts' decode kernel and the weights disagree on the LM head's int8 rows")
            self._drafts[asked] = kernel
        return self._drafts[asked]

    @property
    def pass_positions(self) -> int:
        """Positions a greedy pass runs: 1 (the plain decode), `draft_positions`, or the most that fit."""
        kernel = self._drafts_kernel() if self.draft_positions > 1 else None
        return kernel.info["positions"] if kernel is not None else 1

    def _launch1d(self, kernel, n: int, args) -> None:
        blocks = int(min(max(1, (n + 255) // 256), 65535))
        kernel((blocks,), (256,), args, stream=self.stream)

    def _bf16(self, host: np.ndarray, out) -> None:
        """Round a host fp32 tensor to bf16 into the device slice `out` (uint16)."""
        cp = self.cp
        src = cp.asarray(np.ascontiguousarray(host, dtype=np.float32)).ravel()
        self._launch1d(self.k_f32_to_bf16, src.size, (src, out, np.int64(src.size)))

    def _upload(self, w: dict[str, np.ndarray], lay: Layout) -> None:
        cp, c = self.cp, self.config
        H, inter, V = c.hidden_size, c.intermediate_size, c.vocab_size
        self.w = cp.empty(lay.total, dtype=cp.uint16)
        ws = np.zeros(lay.stotal, dtype=np.float32)
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            base = i * lay.lstride
            at = base + lay.off_qkv
            for n in "qkv":
                t = w[p + f"self_attn.{n}_proj.weight"]
                self._bf16(t, self.w[at : at + t.size])
                at += t.size
            t = w[p + "self_attn.o_proj.weight"]
            self._bf16(t, self.w[base + lay.off_o : base + lay.off_o + t.size])
            gu = self.w[base + lay.off_gu : base + lay.off_gu + 2 * inter * H].reshape(inter, 2, H)
            for j, n in enumerate(("gate", "up")):
                tmp = cp.empty(inter * H, dtype=cp.uint16)
                self._bf16(w[p + f"mlp.{n}_proj.weight"], tmp)
                gu[:, j, :] = tmp.reshape(inter, H)
            # down as its column slices, each [H][inter / dn_layout] (kernels: DN_LAYOUT)
            split = self.kernel_info["dn_layout"]
            t = w[p + "mlp.down_proj.weight"].reshape(H, split, inter // split).transpose(1, 0, 2)
            self._bf16(t, self.w[base + lay.off_dn : base + lay.off_dn + t.size])
            s = i * lay.sstride
            ws[s + lay.s_attn_norm : s + lay.s_attn_norm + H] = w[p + "input_layernorm.weight"]
            ws[s + lay.s_mlp_norm : s + lay.s_mlp_norm + H] = w[p + "post_attention_layernorm.weight"]
            if c.qkv_bias:
                ws[s + lay.s_bqkv : s + lay.s_bqkv + lay.nqkv] = np.concatenate(
                    [w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]
                )
            if c.qk_norm:
                ws[s + lay.s_qnorm : s + lay.s_qnorm + c.head_dim] = w[p + "self_attn.q_norm.weight"]
                ws[s + lay.s_knorm : s + lay.s_knorm + c.head_dim] = w[p + "self_attn.k_norm.weight"]
        ws[lay.s_final : lay.s_final + H] = w["model.norm.weight"]
        self._bf16(w["model.embed_tokens.weight"], self.w[lay.off_emb : lay.off_emb + V * H])
        if not self.tied:
            self._bf16(w["lm_head.weight"], self.w[lay.off_lmh : lay.off_lmh + V * H])
        self.ws = cp.asarray(ws)
        if lay.off_lm8 is not None:
            self._upload_lm_screen(lay)
        inv = rope.inverse_frequencies(c, w.get("rope_freqs.weight"))
        cos, sin = rope.cos_sin(inv, np.arange(self.max_context))
        half = c.head_dim // 2
        self.rcos = cp.asarray(np.ascontiguousarray(cos[:, :half]))
        self.rsin = cp.asarray(np.ascontiguousarray(sin[:, :half]))

    def _upload_lm_screen(self, lay: Layout) -> None:
        """The LM head's int8 rows and their constants (kernels: LM_SCREEN), a few thousand rows at a time."""
        cp, c = self.cp, self.config
        H, V = c.hidden_size, c.vocab_size
        rows = self.w[lay.off_lmh : lay.off_lmh + V * H].reshape(V, H)
        q8 = self.w[lay.off_lm8 : lay.off_lm8 + V * H // 2].view(cp.int8).reshape(V, H)
        consts = self.ws[lay.s_lmq : lay.s_lmq + 4 * V].reshape(V, 4)
        for r0 in range(0, V, 4096):
            q8[r0 : r0 + 4096], consts[r0 : r0 + 4096] = lm_screen_rows(rows[r0 : r0 + 4096], cp)

    def _alloc(self, lay: Layout) -> None:
        cp, c = self.cp, self.config
        shape = (c.num_layers, c.num_kv_heads, self.max_context, c.head_dim)
        self.kc = cp.zeros(shape, dtype=cp.float32)
        self.vc = cp.zeros(shape, dtype=cp.float32)
        V = c.vocab_size
        vpad = (V + 7) // 8 * 8
        f32 = lambda n: cp.full(n, np.nan, dtype=cp.float32)  # noqa: E731  poisoned until written
        self.hop = self._main.hop
        self.logits = f32(V)
        self.keys = cp.zeros(V, dtype=cp.uint32)
        self.bins = cp.full(vpad, 0xFFFF, dtype=cp.uint16)
        self.slot_val = f32(DRAFT_POSITIONS_MAX * self.nblk)  # a block's best row, a slot a position of a pass
        self.slot_idx = cp.zeros(DRAFT_POSITIONS_MAX * self.nblk, dtype=cp.int32)
        self.rep_bits = cp.zeros((V + 31) // 32, dtype=cp.uint32)
        self.stop_ids = cp.zeros(self.kernel_info["max_stop"], dtype=cp.int32)
        cap = self.max_context + 1
        self.context_ids = cp.zeros(cap, dtype=cp.int32)  # the context's tokens, for the drafts' search
        # (uploaded from pinned memory: a copy from pageable memory may wait for the stream's running launch)
        self._context_pinned = cp.cuda.alloc_pinned_memory(4 * cap)
        self._context_staged = np.frombuffer(self._context_pinned, dtype=np.int32, count=cap)
        self._slots = [self._launch_slot(cap) for _ in range(2)]
        self._next_slot = 0
        self._reader = cp.cuda.Stream(non_blocking=True)  # reads a launch's status while the next may run

    def _launch_slot(self, cap: int) -> _LaunchSlot:
        cp = self.cp
        words = {"flags": (np.uint32, self.kernel_info["flags"]), "status": (np.int32, 8), "ctl": (np.int32, 4),
                 "hist_cnt": (np.uint32, NBINS), "hist_mass": (np.uint64, NBINS)}
        ends = np.cumsum([0] + [(n * np.dtype(t).itemsize + 15) // 16 * 16 for t, n in words.values()])
        block = cp.zeros(int(ends[-1]), dtype=cp.uint8)
        views = {name: block[at : at + n * np.dtype(dtype).itemsize].view(dtype)
                 for (name, (dtype, n)), at in zip(words.items(), ends)}
        nparams = len(_PTR_FIELDS) + len(_INT_FIELDS) + len(_FLOAT_FIELDS)
        pinned = cp.cuda.alloc_pinned_memory(8 * nparams + 4 * (cap + 16))
        host = np.frombuffer(pinned, dtype=np.int32, count=cap + 16, offset=8 * nparams)
        return _LaunchSlot(words=block, views=views, tok_time=cp.zeros(cap, dtype=cp.uint64),
                           params=cp.zeros(nparams, dtype=cp.uint64),
                           params_staged=np.frombuffer(pinned, dtype=np.uint64, count=nparams),
                           h_tokens=host[:cap], h_cancel=host[cap + 4 : cap + 5], pinned=pinned)

    @property
    def device_name(self) -> str:
        return self._device_name

    # ---- prefill -------------------------------------------------------------------------
    def prefill(self, tokens: list[int]) -> np.ndarray:
        if self.cached_tokens + len(tokens) > self.max_context:
            raise ValueError("prefill past the end of the context")
        self._check_alive()
        if not tokens:
            return self.last_logits
        with self.device, self.stream:
            self._prefill.run(tokens, self.cached_tokens)
            logits = self.logits.get(stream=self.stream)
        self.stream.synchronize()
        self.cached_tokens += len(tokens)
        self.logits_valid = True
        self.last_logits = logits
        return logits

    # ---- device faults -------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.lost:
            raise KogError(self.lost)

    def _fault(self, error: Exception) -> KogError:
        """A device fault is sticky: nothing on this CUDA context works again in this process."""
        cuda_fault.mark()
        self.lost = f"the GPU faulted during decode ({error}); restart kog to use the GPU again"
        self.logits_valid = False
        return KogError(self.lost)

    def _kernel_ended(self, event) -> bool:
        """Whether the work before `event` has ended. (CuPy's `Event.done` reads a faulted kernel
        as "not yet", which would keep the host waiting for tokens forever.)"""
        status = self.cp.cuda.runtime.eventQuery(event.ptr)
        if status in (0, _NOT_READY):
            return status == 0
        raise self._fault(self.cp.cuda.runtime.CUDARuntimeError(status))

    # ---- decode --------------------------------------------------------------------------
    def _fill_params(self, kernel: _DecodeKernel, slot: _LaunchSlot, start: int, max_tokens: int, *,
                     params: SamplingParams, n_stop: int, use_penalty: bool, debug: str, watchdog_s: float) -> None:
        """Queue the upload of a launch's parameter block into `slot`."""
        hop = kernel.hop
        owned = slot.fields() | {"hop": hop.arena.data.ptr, "hop_map": hop.hop_map.data.ptr,
                                 "sm_side": hop.sm_side.data.ptr}
        ints = {
            "start_pos": start,
            "max_tokens": max_tokens,
            "ctx_limit": self.max_context,
            "n_stop": n_stop,
            "greedy": int(params.greedy),
            "top_k": params.top_k,
            "seed": params.seed & ((1 << 64) - 1),
            "timeout_ns": int(watchdog_s * 1e9),
            "debug": _DEBUG[debug],
            "use_penalty": int(use_penalty),
        }
        floats = {
            "temperature": float(np.float32(params.temperature)) if not params.greedy else 1.0,
            "top_p": float(params.top_p),
            "min_p": float(params.min_p),
            "penalty": float(np.float32(params.repetition_penalty)),
        }
        block = slot.params_staged
        for i, name in enumerate(_PTR_FIELDS):
            block[i] = owned[name] if name in owned else getattr(self, name).data.ptr
        o = len(_PTR_FIELDS)
        for i, name in enumerate(_INT_FIELDS):
            block[o + i] = np.uint64(ints[name] & ((1 << 64) - 1))
        o += len(_INT_FIELDS)
        block[o:] = np.array([floats[n] for n in _FLOAT_FIELDS], dtype=np.float64).view(np.uint64)
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(slot.params.data.ptr, block.ctypes.data, block.nbytes, rt.memcpyHostToDevice, self.stream.ptr)

    def decode(
        self,
        params: SamplingParams,
        history: list[int],
        max_tokens: int,
        stop_ids: set[int],
        *,
        debug: str = "",
        watchdog_s: float = WATCHDOG_S,
    ) -> Iterator[int]:
        """See Backend.decode. `debug` ("hang", "fault") and `watchdog_s` exist for the tests only.

        A drafted decode (`draft_positions` > 1, greedy, no penalty) runs in stretches where `switch_builds`:
        the plain build where the text copies nothing, the drafts' build where it copies its context
        (engine/drafts.py says when to switch). A switch cancels the running launch, which stops after the pass
        it is in, and queues the other build behind it at once (_launches): the two meet on the device."""
        c = self.config
        self._check_alive()
        if max_tokens < 1 or self._cancel.is_set():
            return
        if not self.logits_valid:
            raise KogError("nothing to decode from: prefill at least one token first")
        max_tokens = min(max_tokens, self.max_context + 1)
        stops = sorted(int(t) for t in stop_ids if 0 <= int(t) < c.vocab_size)
        if len(stops) > self.stop_ids.size:
            raise KogError(f"at most {self.stop_ids.size} stop ids are supported, got {len(stops)}")
        use_penalty = params.repetition_penalty != 1.0 and len(history) > 0
        drafts = self._drafts_kernel() if self.draft_positions > 1 and params.greedy and not use_penalty else None
        if drafts is not None and len(history) < self.cached_tokens:
            raise KogError("drafts need every cached token of the context in `history`")
        with self._lock, self.device, self.stream:
            if stops:
                self.stop_ids[: len(stops)].set(np.asarray(stops, dtype=np.int32), stream=self.stream)
            if use_penalty:
                bits = np.zeros(self.rep_bits.size, dtype=np.uint32)
                ids = np.unique(np.asarray(history, dtype=np.int64))
                ids = ids[(ids >= 0) & (ids < c.vocab_size)]
                np.bitwise_or.at(bits, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
                self.rep_bits.set(bits, stream=self.stream)
            if drafts is not None:  # the drafts' search reads the context (later tokens: the kernels write them)
                n = self.cached_tokens
                self._context_staged[:n] = history[:n]
                rt = self.cp.cuda.runtime
                rt.memcpyAsync(self.context_ids.data.ptr, self._context_staged.ctypes.data, 4 * n,
                               rt.memcpyHostToDevice, self.stream.ptr)
        launch = dict(params=params, n_stop=len(stops), use_penalty=use_penalty, debug=debug, watchdog_s=watchdog_s)
        self.last_status, self.token_times_ns, self.switch_gaps_ns = {}, np.zeros(0, np.uint64), []
        stop_set = set(stops)
        if drafts is None:
            yield from self._launches(self._main, max_tokens, stop_set, launch)
        elif not self.switch_builds:
            yield from self._launches(drafts, max_tokens, stop_set, launch)
        else:
            switch = BuildSwitch(self._context_drafts(history[: self.cached_tokens]), drafts.info["positions"])
            yield from self._launches(self._main, max_tokens, stop_set, launch, switch=switch, other=drafts)

    def _launches(self, kernel: _DecodeKernel, max_tokens: int, stops: set[int], launch: dict, *,
                  switch: BuildSwitch | None = None, other: _DecodeKernel | None = None) -> Iterator[int]:
        """A decode's tokens: from one launch of `kernel`, or (`switch`) from launches that alternate between `kernel`
        and `other` as `switch` decides. A switch queues the other build behind the running launch, with the
        hand-over kernel between them (_enqueue), and sets the running launch's cancel word: the host reads how the
        first ended while the second already runs."""
        wait = TokenWait()  # (one cadence over the launches)
        emitted, clobbered = 0, False
        run = self._enqueue(kernel, max_tokens, launch)
        queued: _Launch | None = None
        if switch is not None:
            switch.start(drafting=kernel is other)
        try:
            while True:
                tokens = follow(run.slot.h_tokens, run.max_tokens, stops, lambda: self._kernel_ended(run.done),
                                lambda: self._pass_cancel(run), wait)
                if run.repeat is not None and next(tokens, run.repeat) != run.repeat:  # (none: its status says why)
                    raise KogError("the decode kernel did not go on from the token its launch was given")
                for token in tokens:
                    emitted += 1
                    yield token
                    last = token in stops or emitted == max_tokens  # (the launch ends here anyway)
                    if switch is not None and switch.seen(token) and queued is None and not last:  # (seen: every token)
                        # queued before the cancel: the GPU does not wait for the host's enqueue
                        clobbered = True  # (from here a hand-over may have written the logits)
                        queued = self._enqueue(other if run.kernel is kernel else kernel, max_tokens - emitted + 1,
                                               launch, after=run)
                        run.slot.h_cancel[0] = 1  # the kernel stops after the pass it is in
                st = self._finish(run)
                run.done = None
                if st[0]:
                    raise self._stopped(st, launch["watchdog_s"])
                if queued is None or st[3] != _R_CANCEL or self._cancel.is_set():
                    return
                queued.start, queued.max_tokens = self.cached_tokens, run.max_tokens - int(st[1]) + 1
                queued.repeat = token
                run, queued, clobbered = queued, None, False
                switch.start(drafting=run.kernel is other)
        finally:
            for left in (run, queued):  # (a consumer that stopped early, an error, or a launch queued for nothing)
                if left is not None and left.done is not None:
                    left.slot.h_cancel[0] = 1
            if run.done is not None:
                self._finish(run)
            if queued is not None:  # its tokens and cache writes count for nothing
                self._wait(queued)
            if clobbered:  # a hand-over wrote the logits after the last launch that counts
                self.logits_valid = False

    def _pass_cancel(self, run: _Launch) -> None:
        """Hand a host cancel() to the running launch, which reads its mapped word once a token."""
        if self._cancel.is_set():
            run.slot.h_cancel[0] = 1

    def _context_drafts(self, context: list[int]) -> ContextDrafts:
        """The draft index of `context`: the last decode's, extended, where `context` continues its context (an
        agent's next step), else a new one."""
        last = self._last_context
        if last is None or len(last.tokens) > len(context) or last.tokens != context[: len(last.tokens)]:
            last = ContextDrafts()
        last.extend(context[len(last.tokens) :])
        self._last_context = last
        return last

    def _enqueue(self, kernel: _DecodeKernel, max_tokens: int, launch: dict, *, after: _Launch | None = None) -> _Launch:
        """Queue a launch of `kernel` on the slot the last launch did not use: from the logits in place and
        `cached_tokens`, or (`after`) behind the running launch `after`, going on from where that one stops (the
        hand-over kernel runs between them; `max_tokens` is then a bound the hand-over narrows)."""
        cp = self.cp
        slot = self._slots[self._next_slot]
        self._next_slot ^= 1
        start = self.cached_tokens
        with self._lock, self.device, self.stream:
            for words in (slot.words, kernel.hop.arena):
                cp.cuda.runtime.memsetAsync(words.data.ptr, 0, words.nbytes, self.stream.ptr)
            self._fill_params(kernel, slot, start, max_tokens, **launch)
            if after is not None:
                ints = 8 * len(_PTR_FIELDS)
                copy_fed = after.kernel.info["positions"] == 1  # (the drafts' build writes context_ids itself)
                args = (after.slot.views["status"], np.uint64(after.slot.params.data.ptr + ints),
                        np.uint64(slot.params.data.ptr + ints), np.uint64(after.slot.h_tokens.ctypes.data),
                        np.int32(copy_fed), self.context_ids, self.logits, np.int32(self.config.vocab_size))
                # (two blocks: each block's read of the host-mapped token is a round trip over the bus, and they
                # queue one behind another, ~1 us each on an H100, while two fill a 152k-token vocabulary in ~10 us)
                self.k_hand_over((2,), (1024,), args, stream=self.stream)
            slot.h_cancel[0] = 0
            slot.h_tokens[:max_tokens] = -1
            try:
                kernel.function((self.nblk,), (self.nthr,), (slot.params,), shared_mem=kernel.smem, stream=self.stream)
            except Exception as e:  # noqa: BLE001 - a launch refused (co-residency, resources)
                raise KogError(f"cannot launch the decode kernel: {type(e).__name__}: {e}") from None
            done = cp.cuda.Event(block=False, disable_timing=True)
            done.record(self.stream)
        # a screened LM head or a drafted pass leaves no logits behind: the next decode starts from a prefill
        screened = self.kernel_info["lm_screen"] and launch["params"].greedy and not launch["use_penalty"]
        return _Launch(kernel=kernel, slot=slot, done=done, start=start, max_tokens=max_tokens,
                       leaves_logits=not (screened or kernel.info["positions"] > 1))

    def _wait(self, run: _Launch) -> None:
        try:
            run.done.synchronize()
        except self.cp.cuda.runtime.CUDARuntimeError as e:
            raise self._fault(e) from None

    def _finish(self, run: _Launch) -> np.ndarray:
        """Wait for `run` to end and take its status and token stamps (on a stream of their own: the next launch may
        be queued behind it) into last_status, token_times_ns, cached_tokens and logits_valid; its status."""
        self._wait(run)
        try:
            st = run.slot.views["status"].get(stream=self._reader)
            times = run.slot.tok_time[: int(st[1])].get(stream=self._reader) if not st[0] else None
        except self.cp.cuda.runtime.CUDARuntimeError as e:
            raise self._fault(e) from None
        self._add_status(st, run.repeat is not None)
        if st[0]:
            self.cached_tokens = run.start
            self.logits_valid = False
            return st
        self.cached_tokens = run.start + int(st[2])
        if run.repeat is not None and len(times) and len(self.token_times_ns):
            self.switch_gaps_ns.append(int(times[0]) - int(self.token_times_ns[-1]))
        self.token_times_ns = np.concatenate([self.token_times_ns, times[int(run.repeat is not None) :]])
        # a screened LM head or a drafted pass leaves no logits behind: the next decode starts from a prefill
        self.logits_valid = run.leaves_logits
        return st

    @staticmethod
    def _stopped(st: np.ndarray, watchdog_s: float) -> KogError:
        what = _ERRORS.get(int(st[0]), f"error {int(st[0])}")
        return KogError(f"GPU decode stopped: {what} (block {int(st[6])}, phase {int(st[5])}, "
                        f"limit {watchdog_s:g} s); the device is free again")

    def _add_status(self, st: np.ndarray, repeat: bool) -> None:
        """last_status over a decode's launches: the last one's error, reason and place; tokens (each once),
        positions fed and passes added up."""
        before = self.last_status
        self.last_status = {
            "error": int(st[0]), "tokens": before.get("tokens", 0) + int(st[1]) - int(repeat),
            "fed": before.get("fed", 0) + int(st[2]), "reason": int(st[3]), "approx": int(st[4]),
            "where": int(st[5]), "block": int(st[6]), "passes": before.get("passes", 0) + int(st[7]),
            "launches": before.get("launches", 0) + 1,
        }
        self.decode_passes = self.last_status["passes"]

    def poison(self) -> None:
        """Tests: NaN-fill every scratch buffer and the cache past `cached_tokens`, so that
        anything the kernel reads before writing it shows up in the results. (The tagged
        vectors need none: zeroed at launch, a word nobody wrote never carries a phase, and a
        read of one ends in the watchdog's error.)"""
        with self.device, self.stream:
            self.slot_val.fill(np.nan)
            self.keys.fill(0xFFFFFFFF)
            self.slot_idx.fill(-1)
            self.bins[: self.config.vocab_size].fill(0xFFFE)
            self.kc[:, :, self.cached_tokens :] = np.nan
            self.vc[:, :, self.cached_tokens :] = np.nan
        self.stream.synchronize()

    def close(self) -> None:
        for name in list(vars(self)):
            if name in ("w", "ws", "kc", "vc", "rcos", "rsin", "logits"):
                setattr(self, name, None)
