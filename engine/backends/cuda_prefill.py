"""The CUDA backend's batched prefill: a prompt through every layer in nine launches a layer.

Matrix products run on tensor cores without giving up fp32 accuracy. Each fp32 activation
matrix X [n, K] is written as three bf16 terms (X = Xh + Xm + Xl to 2^-24 relative) stacked
into one [3n, K] matrix; ONE cuBLAS GEMM against the bf16 weights (a bf16 x bf16 product is
exact in fp32; fp32 accumulation) gives three fp32 partial products, which the next fused
kernel of kernels/prefill.cu sums before its own work (bias, q/k norm, RoPE and the cache
write; the residual add and the next RMSNorm; SiLU(gate) * up). Attention is one fused
causal fp32 kernel over the KV cache the same pass writes. The LM head runs for the last
position only. Long prompts run CHUNK rows at a time, which bounds the scratch memory.
"""

from __future__ import annotations

import numpy as np

CHUNK = 2048  # prompt rows per pass: the gate/up product alone is 3 x rows x 2*inter fp32
ATTN_ROWS = 64  # query rows per attention block (kernels/prefill.cu: ABM)
QKV_WAVES = 4  # heads per block of kog_qkv_rope

# cuBLAS and CUDA enum values (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_32F, _R_16BF = 0, 14
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_NULL = np.uint64(0)


class CudaPrefill:
    """Runs `tokens` at cache positions start.. on the backend's device and stream."""

    def __init__(self, backend, module):
        from cupy_backends.cuda.libs import cublas

        self.cublas = cublas
        self.be = be = backend
        c, lay = be.config, be.lay
        get = module.get_function
        self.k_embed = get("kog_embed")
        self.k_rms = get("kog_add_rms_split")
        self.k_silu = get("kog_silu_split")
        self.k_gemv = get("kog_gemv_bf16")
        self.k_qkv = get(f"kog_qkv_rope_d{c.head_dim}")
        self.k_attn = get(f"kog_attn_d{c.head_dim}")
        self.attn_smem = 3 * ATTN_ROWS * (c.head_dim + 4) * 4  # Q, K (then P) and V tiles
        self.k_attn.max_dynamic_shared_size_bytes = self.attn_smem
        self.eps = np.float32(c.rms_norm_eps)
        self.scale = np.float32(1.0 / np.sqrt(c.head_dim))
        self.last = be.cp.empty(c.hidden_size, dtype=be.cp.float32)
        # device addresses that never change, per layer
        w, ws = be.w.data.ptr, be.ws.data.ptr
        kv_layer = c.num_kv_heads * be.max_context * c.head_dim * 4
        self.layers = []
        for i in range(c.num_layers):
            base, s = w + 2 * i * lay.lstride, ws + 4 * i * lay.sstride
            self.layers.append(dict(
                wqkv=base + 2 * lay.off_qkv, wo=base + 2 * lay.off_o, wgu=base + 2 * lay.off_gu,
                wdn=base + 2 * lay.off_dn,
                attn_norm=np.uint64(s + 4 * lay.s_attn_norm), mlp_norm=np.uint64(s + 4 * lay.s_mlp_norm),
                bias=np.uint64(s + 4 * lay.s_bqkv) if c.qkv_bias else _NULL,
                qnorm=np.uint64(s + 4 * lay.s_qnorm) if c.qk_norm else _NULL,
                knorm=np.uint64(s + 4 * lay.s_knorm) if c.qk_norm else _NULL,
                kc=np.uint64(be.kc.data.ptr + i * kv_layer), vc=np.uint64(be.vc.data.ptr + i * kv_layer),
            ))
        self.final_norm = np.uint64(ws + 4 * lay.s_final)
        self.emb = np.uint64(w + 2 * lay.off_emb)
        self.lmh = np.uint64(w + 2 * lay.off_lmh)

    def run(self, tokens: list[int], start: int) -> None:
        """Append `tokens` to the cache; the last position's logits land in the backend's `logits`.
        Call inside the backend's device and stream contexts."""
        be = self.be
        handle = be.cp.cuda.device.get_cublas_handle()
        self.cublas.setStream(handle, be.stream.ptr)
        self.cublas.setPointerMode(handle, self.cublas.CUBLAS_POINTER_MODE_HOST)
        for c0 in range(0, len(tokens), CHUNK):
            part = tokens[c0 : c0 + CHUNK]
            self._chunk(handle, part, start + c0, last=c0 + len(part) == len(tokens))

    def _gemm(self, handle, xs, rows: int, k: int, w: int, nout: int, out, *, col0: int = 0, ldx: int = 0,
              accumulate: bool = False) -> None:
        """out [3 rows, nout] fp32 (+)= xs [3 rows, col0 : col0 + k] bf16 @ W [nout, k]^T (xs rows `ldx`
        long, default k); cuBLAS is column-major, so this is out^T = W^T(k x nout, transposed) x xs^T."""
        self.cublas.gemmEx(
            handle, _OP_T, _OP_N, nout, 3 * rows, k,
            _ONE.ctypes.data, w, _R_16BF, k, xs.data.ptr + 2 * col0, _R_16BF, ldx or k,
            (_ONE if accumulate else _ZERO).ctypes.data, out.data.ptr, _R_32F, nout, _COMPUTE_32F, _GEMM_DEFAULT,
        )

    def _chunk(self, handle, tokens: list[int], start: int, last: bool) -> None:
        be = self.be
        cp, c, lay, stream = be.cp, be.config, be.lay, be.stream
        H, inter, nh, nkv = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads
        n = len(tokens)
        i32 = np.int32
        ids = cp.asarray(np.asarray(tokens, dtype=np.int32))
        x = cp.empty((n, H), dtype=cp.float32)
        q = cp.empty((n, lay.qd), dtype=cp.float32)
        xs = cp.empty(3 * n * max(H, lay.qd, inter), dtype=cp.uint16)
        prod = cp.empty(3 * n * max(lay.nqkv, H, 2 * inter), dtype=cp.float32)
        self.k_embed((n,), (256,), (ids, self.emb, x, i32(H)), stream=stream)
        rms = lambda add, norm: self.k_rms(  # noqa: E731
            (n,), (256,), (add, x, norm, xs, _NULL, i32(n), i32(H), i32(0), self.eps), stream=stream)
        qkv_grid = ((nh + 2 * nkv + QKV_WAVES - 1) // QKV_WAVES, n)
        attn_grid = (nh, (n + ATTN_ROWS - 1) // ATTN_ROWS)
        silu_blocks = int(min((n * inter + 255) // 256, 16 * be.nblk))
        split = be.kernel_info["dn_layout"]
        dk = inter // split
        prev = _NULL  # the product to add to x before the next norm: none before layer 0
        for L in self.layers:
            rms(prev, L["attn_norm"])
            self._gemm(handle, xs, n, H, L["wqkv"], lay.nqkv, prod)
            self.k_qkv(qkv_grid, (32 * QKV_WAVES,), (
                prod, i32(n), i32(start), L["bias"], L["qnorm"], L["knorm"], be.rcos, be.rsin,
                L["kc"], L["vc"], i32(be.max_context), q, i32(nh), i32(nkv), self.eps), stream=stream)
            self.k_attn(attn_grid, (256,), (
                q, L["kc"], L["vc"], xs, i32(n), i32(start), i32(nh), i32(nkv), i32(be.max_context), self.scale),
                shared_mem=self.attn_smem, stream=stream)
            self._gemm(handle, xs, n, lay.qd, L["wo"], H, prod)
            rms(prod, L["mlp_norm"])
            self._gemm(handle, xs, n, H, L["wgu"], 2 * inter, prod)
            self.k_silu((silu_blocks,), (256,), (prod, xs, i32(n), i32(inter)), stream=stream)
            for j in range(split):  # down's column slices (the decode kernel's layout), summed
                self._gemm(handle, xs, n, dk, L["wdn"] + 2 * j * H * dk, H, prod, col0=j * dk, ldx=inter,
                           accumulate=j > 0)
            prev = prod
        if last:  # the down product of the last row, the final norm, the LM head
            self.k_rms((1,), (256,), (prod, x, self.final_norm, xs, self.last, i32(n), i32(H), i32(n - 1), self.eps),
                       stream=stream)
            V = c.vocab_size
            self.k_gemv(((V * 32 + 255) // 256,), (256,), (self.lmh, self.last, be.logits, i32(V), i32(H)),
                        stream=stream)
