"""Causal flash attention for prefill (context encoding), current NKI API: ``kernel(q, k, v)``.

q, k, v are [H, S, d] (d <= 128, S a multiple of 128); out[h] = softmax(q[h] k[h]^T / sqrt(d),
causal) v[h]. Heads are a loop (``nl.affine_range``); launched as ``kernel[2]`` the two programs
of a logical core take half the heads each.

Per head, K^T [d, S] and V [128, S/128, d] are loaded once. Each tile of 128 queries walks its key
range in blocks of up to 512 keys (one fp32 PSUM bank, the moving-operand limit) with an online
softmax: a running row max m (kept negated, as the exp bias wants it), a running row sum l and an
fp32 accumulator rescaled by exp(m_old - m_new). Blocks above the diagonal are never visited;
only the last 128 keys of the last block need the causal mask (a precomputed 0 / -30000 bias).

Layouts: the tensor engine contracts over partitions, so
  scores[q, k] = Q K^T   takes Q^T [d, 128q] (stationary) and K^T [d, <=512k] (moving);
  out[q, :]  += P V      takes P^T [128k, 128q] (stationary) and V [128k, d] (moving).
Q, K and P are transposed on chip with nisa.nc_transpose; 1/sqrt(d) is folded into Q^T.
"""

import math

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

TQ = 128   # queries per tile (partitions) and keys per transpose
TK = 512   # keys per score block: one fp32 PSUM bank
NEG = -30000.0  # masked score: exp() of it underflows to 0 in fp32 and bf16


def _programs():
    """(programs, this program); one program when launched without a grid."""
    if nl.program_ndim() == 0:
        return 1, 0
    return nl.num_programs(axes=0), nl.program_id(axis=0)


def _load_head(k, v, h, S, d):
    """K^T [d, S] and V [128, S/128, d] of head h, in SBUF for all its query tiles."""
    n_tiles = S // TQ
    k_sb = nl.ndarray((TQ, n_tiles, d), dtype=k.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((TQ, n_tiles, d), dtype=v.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(n_tiles):
        nisa.dma_copy(dst=k_sb[:, t, :], src=k[h, t * TQ:(t + 1) * TQ, :])
        nisa.dma_copy(dst=v_sb[:, t, :], src=v[h, t * TQ:(t + 1) * TQ, :])
    # Four 128-key transposes fill one PSUM bank, evicted with one copy.
    kT = nl.ndarray((d, S), dtype=k.dtype, buffer=nl.sbuf)
    for b0 in range(0, S, TK):
        w = min(TK, S - b0)
        kT_ps = nl.ndarray((d, w), dtype=k.dtype, buffer=nl.psum)
        for c in nl.affine_range(w // TQ):
            nisa.nc_transpose(dst=kT_ps[:, c * TQ:(c + 1) * TQ], data=k_sb[:, b0 // TQ + c, :])
        nisa.tensor_copy(dst=kT[:, b0:b0 + w], src=kT_ps)
    return kT, v_sb


def _load_query(q, h, i, d):
    """Q^T [d, 128] of query tile i, scaled by 1/sqrt(d) as it leaves PSUM."""
    q_sb = nl.ndarray((TQ, d), dtype=q.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=q_sb, src=q[h, i * TQ:(i + 1) * TQ, :])
    qT_ps = nl.ndarray((d, TQ), dtype=q.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=qT_ps, data=q_sb)
    qT = nl.ndarray((d, TQ), dtype=q.dtype, buffer=nl.sbuf)
    nisa.activation(dst=qT, op=nl.copy, data=qT_ps, scale=1.0 / math.sqrt(d))
    return qT


def _block(qT, kT, v_sb, b0, w, diagonal, diag_bias, state):
    """One block of w keys from b0 for a query tile: the online-softmax update of state
    (neg_m, l, acc; None before the first block). Returns the new state."""
    d = v_sb.shape[2]
    s_ps = nl.ndarray((TQ, w), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT[:, b0:b0 + w])
    if diagonal:
        # The block ends on the diagonal: evict to SBUF, adding the causal bias to its last 128
        # columns (the columns before are all visible).
        s = nl.ndarray((TQ, w), dtype=nl.float32, buffer=nl.sbuf)
        if w > TQ:
            nisa.tensor_copy(dst=s[:, 0:w - TQ], src=s_ps[:, 0:w - TQ])
        nisa.tensor_tensor(dst=s[:, w - TQ:w], data1=s_ps[:, w - TQ:w], data2=diag_bias, op=nl.add)
    else:
        s = s_ps  # fully visible: the engines read the scores from PSUM

    # m_new = max(m, rowmax(s)), kept negated (the exp bias).
    neg_m_new = nl.ndarray((TQ, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_m_new, op=nl.maximum, data=s, axis=1, negate=True, keepdims=True)
    if state is not None:
        neg_m, l, acc = state
        nisa.tensor_tensor(dst=neg_m_new, data1=neg_m, data2=neg_m_new, op=nl.minimum)
        alpha = nl.ndarray((TQ, 1), dtype=nl.float32, buffer=nl.sbuf)  # exp(m_old - m_new)
        nisa.activation(dst=alpha, op=nl.exp, data=neg_m, scale=-1.0, bias=neg_m_new)
    # p = exp(s - m_new) in the dtype of V (the PV matmul's operand), row sums in fp32.
    p = nl.ndarray((TQ, w), dtype=v_sb.dtype, buffer=nl.sbuf)
    row_sum = nl.ndarray((TQ, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_m_new, reduce_op=nl.add, reduce_res=row_sum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)

    # P^T: one transpose per 128 keys into one PSUM bank, one eviction; then P V accumulated over
    # the block's 128-key tiles in PSUM.
    n_c = w // TQ
    pT_ps = nl.ndarray((TQ, n_c, TQ), dtype=v_sb.dtype, buffer=nl.psum)
    for c in nl.affine_range(n_c):
        nisa.nc_transpose(dst=pT_ps[:, c, :], data=p[:, c * TQ:(c + 1) * TQ])
    pT = nl.ndarray((TQ, n_c, TQ), dtype=v_sb.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pT, src=pT_ps)
    pv_ps = nl.ndarray((TQ, d), dtype=nl.float32, buffer=nl.psum)
    for c in nl.affine_range(n_c):
        nisa.nc_matmul(dst=pv_ps, stationary=pT[:, c, :], moving=v_sb[:, b0 // TQ + c, :])

    if state is None:  # first block: nothing to rescale
        acc = nl.ndarray((TQ, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=acc, src=pv_ps)
        return neg_m_new, row_sum, acc
    # l = l * alpha + row_sum; acc = acc * alpha + P V (one vector pass each)
    nisa.tensor_scalar(dst=l, data=l, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=row_sum)
    nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv_ps)
    return neg_m_new, l, acc


@nki.jit
def flash_attention_prefill(q, k, v):
    H, S, d = q.shape
    assert k.shape == v.shape == (H, S, d), f"q {q.shape}, k {k.shape}, v {v.shape} must all be [H, S, d]"
    assert S % TQ == 0 and d <= 128, "S must be a multiple of 128 and d at most 128"
    n_prog, pid = _programs()
    assert H % n_prog == 0, "heads must split evenly between the programs"
    heads = H // n_prog
    out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)

    # Additive causal bias of a diagonal 128 x 128 block: 0 where key <= query, NEG above.
    # affine_select keeps on_true where partition - column >= 0.
    diag_bias = nl.ndarray((TQ, TQ), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=diag_bias, value=0.0)
    nisa.affine_select(dst=diag_bias, pattern=[[-1, TQ]], channel_multiplier=1, on_true_tile=diag_bias,
                       on_false_value=NEG, cmp_op=nl.greater_equal)

    for hh in nl.affine_range(heads):
        h = pid * heads + hh
        kT, v_sb = _load_head(k, v, h, S, d)
        # Python loops: the causal bounds are trace-time constants, so skipped blocks cost nothing.
        for i in range(S // TQ):
            qT = _load_query(q, h, i, d)
            kv_end = (i + 1) * TQ  # keys 0 .. kv_end-1 are visible to this query tile
            state = None
            for b0 in range(0, kv_end, TK):
                w = min(TK, kv_end - b0)
                state = _block(qT, kT, v_sb, b0, w, b0 + w == kv_end, diag_bias, state)
            _, l, acc = state
            # out = acc / l, in the output dtype.
            inv_l = nl.ndarray((TQ, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.reciprocal(dst=inv_l, data=l)
            o = nl.ndarray((TQ, d), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=o, data=acc, op0=nl.multiply, operand0=inv_l)
            nisa.dma_copy(dst=out[h, i * TQ:(i + 1) * TQ, :], src=o)
    return out


def reference(q, k, v):
    # A leading batch dim: 4-D inputs take PyTorch's fused (flash) CPU kernel.
    return torch.nn.functional.scaled_dot_product_attention(q.float()[None], k.float()[None], v.float()[None],
                                                            is_causal=True)[0].to(q.dtype)


def main():
    H, S, d = 4, 640, 64
    q, k, v = (torch.randn(H, S, d, device="neuron") for _ in range(3))
    expected = reference(q.cpu(), k.cpu(), v.cpu())
    o = flash_attention_prefill(q, k, v)
    torch.neuron.synchronize()
    print("device   max error:", (o.cpu() - expected).abs().max().item())
    o_np = nki.simulate(flash_attention_prefill)(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy())
    print("simulate max error:", np.abs(o_np - expected.numpy()).max())
    o2 = flash_attention_prefill[2](q, k, v)  # two programs, two heads each
    print("lnc=2    max error:", (o2.cpu() - expected).abs().max().item())


if __name__ == "__main__":
    main()
