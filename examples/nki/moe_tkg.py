"""Mixture-of-experts MLP for token generation (all-expert mode), current NKI API.

x [T, H] (T <= 128 tokens), router weight w_router [H, E] (E >= 8 experts), fused expert
weights w_gate_up [E, H, 2, I] (gate and up of each expert side by side) and w_down [E, I, H].
Returns (out [T, H], expert_index [T, top_k] uint32):

  router   logits = x @ w_router; the top_k largest logits of each token select its experts
           (nisa.max8 gives the 8 largest values in order, nisa.nc_find_index8 their positions);
           affinities = softmax over the selected logits, 0 for the other experts.
  experts  every expert runs the SwiGLU MLP on all tokens (T * top_k >= E in token generation, so
           nearly every expert's weights are read anyway), and its output is scaled by the
           tokens' affinities for it (0 when not selected) before the sum over experts.

The expert loop is an ``affine_range``: experts are independent, each writes its own slice of a
[T, H, E] buffer, reduced over E at the end. The projections are those of fused_mlp.py: x^T
stationary, each [128, 512] weight block streamed once as the moving operand.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128    # partitions: contraction tile of every matmul
TN = 512   # output columns per PSUM bank (fp32)


@nki.jit
def moe_tkg(x, w_router, w_gate_up, w_down, top_k=2):
    T, H = x.shape
    E = w_router.shape[1]
    I = w_down.shape[1]
    assert w_gate_up.shape == (E, H, 2, I) and w_down.shape == (E, I, H), "w_gate_up [E, H, 2, I], w_down [E, I, H]"
    assert T <= P and H % TN == 0 and I % TN == 0, "T <= 128; H and I multiples of 512"
    assert 8 <= E <= TN and 1 <= top_k <= 8, "max8 needs at least 8 experts; top_k at most 8"
    KH, KI = H // P, I // P
    out = nl.ndarray((T, H), dtype=x.dtype, buffer=nl.shared_hbm)
    expert_index = nl.ndarray((T, top_k), dtype=nl.uint32, buffer=nl.shared_hbm)

    # x^T [128, H/128, T]: hidden on partitions, the contraction layout of every projection.
    x_sb = nl.ndarray((T, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    xT = nl.ndarray((P, KH, T), dtype=x.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KH):
        xT_ps = nl.ndarray((P, T), dtype=x.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps, data=x_sb[:, k * P:(k + 1) * P])
        nisa.tensor_copy(dst=xT[:, k, :], src=xT_ps)

    # -- router: logits [T, E], tokens on partitions -----------------------------------------------
    wr = nl.ndarray((P, KH, E), dtype=w_router.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(KH):
        nisa.dma_copy(dst=wr[:, k, :], src=w_router[k * P:(k + 1) * P, :])
    logits_ps = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(KH):
        nisa.nc_matmul(dst=logits_ps, stationary=xT[:, k, :], moving=wr[:, k, :])
    logits = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=logits, src=logits_ps)

    top8 = nl.ndarray((T, 8), dtype=nl.float32, buffer=nl.sbuf)   # descending
    nisa.max8(dst=top8, src=logits)
    idx8 = nl.ndarray((T, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx8, data=logits, vals=top8)
    nisa.dma_copy(dst=expert_index, src=idx8[:, 0:top_k])

    # Affinities: exp(logit - max) on the selected experts (logit >= the k-th largest), normalised.
    selected = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=selected, data=logits, op0=nl.greater_equal, operand0=top8[:, top_k - 1:top_k])
    neg_max = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_max, data=top8[:, 0:1], op0=nl.multiply, operand0=-1.0)
    ex = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ex, op=nl.exp, data=logits, bias=neg_max)
    aff = nl.ndarray((T, E), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=aff, data1=ex, data2=selected, op=nl.multiply)
    total = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total, op=nl.add, data=aff, axis=1, keepdims=True)
    inv_total = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv_total, data=total)
    nisa.tensor_scalar(dst=aff, data=aff, op0=nl.multiply, operand0=inv_total)

    # -- experts ---------------------------------------------------------------------------------
    # With T tokens the weights are the data that moves: x^T is the stationary operand, and each
    # [128, 512] weight block streams through once as the moving operand (512 columns per matmul).
    ys = nl.ndarray((T, H, E), dtype=nl.float32, buffer=nl.sbuf)  # affinity-scaled expert outputs
    for e in nl.affine_range(E):
        # h = silu(x Wg) * (x Wu), [T, I]: tokens on partitions.
        h = nl.ndarray((T, I), dtype=x.dtype, buffer=nl.sbuf)
        for n in nl.affine_range(I // TN):
            cols = slice(n * TN, (n + 1) * TN)
            g_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
            u_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(KH):
                wg = nl.ndarray((P, TN), dtype=w_gate_up.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=wg, src=w_gate_up[e, k * P:(k + 1) * P, 0, cols])
                wu = nl.ndarray((P, TN), dtype=w_gate_up.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=wu, src=w_gate_up[e, k * P:(k + 1) * P, 1, cols])
                nisa.nc_matmul(dst=g_ps, stationary=xT[:, k, :], moving=wg)
                nisa.nc_matmul(dst=u_ps, stationary=xT[:, k, :], moving=wu)
            g = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=g, op=nl.silu, data=g_ps)
            nisa.tensor_tensor(dst=h[:, cols], data1=g, data2=u_ps, op=nl.multiply)

        # h^T [128, I/128, T]: the stationary operand of the down projection.
        hT = nl.ndarray((P, KI, T), dtype=x.dtype, buffer=nl.sbuf)
        for m in nl.affine_range(KI):
            hT_ps = nl.ndarray((P, T), dtype=x.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=hT_ps, data=h[:, m * P:(m + 1) * P])
            nisa.tensor_copy(dst=hT[:, m, :], src=hT_ps)

        # Down projection [T, H], scaled by each token's affinity for this expert on eviction.
        for n in nl.affine_range(H // TN):
            cols = slice(n * TN, (n + 1) * TN)
            o_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
            for m in nl.affine_range(KI):
                wd = nl.ndarray((P, TN), dtype=w_down.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=wd, src=w_down[e, m * P:(m + 1) * P, cols])
                nisa.nc_matmul(dst=o_ps, stationary=hT[:, m, :], moving=wd)
            nisa.tensor_scalar(dst=ys[:, cols, e], data=o_ps, op0=nl.multiply, operand0=aff[:, e:e + 1])

    y = nl.ndarray((T, H), dtype=out.dtype, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=y, op=nl.add, data=ys, axis=2)
    nisa.dma_copy(dst=out, src=y)
    return out, expert_index


def reference(x, w_router, w_gate_up, w_down, top_k=2):
    """The usual PyTorch MoE layer: softmax router, top-k renormalised, a loop over the experts
    that runs each on the tokens routed to it."""
    xf = x.float()
    probs = torch.softmax(xf @ w_router.float(), dim=-1)
    weights, index = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(xf)
    for e in range(w_router.shape[1]):
        tokens, slot = (index == e).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        xe = xf[tokens]
        h = torch.nn.functional.silu(xe @ w_gate_up[e, :, 0].float()) * (xe @ w_gate_up[e, :, 1].float())
        out.index_add_(0, tokens, (h @ w_down[e].float()) * weights[tokens, slot, None])
    return out.to(x.dtype), index.to(torch.uint32)


def main():
    T, H, I, E = 4, 512, 512, 8
    x = torch.randn(T, H, device="neuron")
    w_router = torch.randn(H, E, device="neuron")
    w_gate_up = torch.randn(E, H, 2, I, device="neuron") / H ** 0.5
    w_down = torch.randn(E, I, H, device="neuron") / I ** 0.5
    args = (x, w_router, w_gate_up, w_down)
    expected, expected_index = reference(*(a.cpu() for a in args))
    y, index = moe_tkg(*args)
    torch.neuron.synchronize()
    print("experts chosen as torch chooses:", bool(torch.equal(index.cpu(), expected_index)))
    print("device   max error:", (y.cpu() - expected).abs().max().item())
    y_np, _ = nki.simulate(moe_tkg)(*(a.cpu().numpy() for a in args))
    print("simulate max error:", np.abs(y_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
