"""The fused capture kernel (rapids_attn/extract/fused.py) compiled on a CUDA GPU. Marked ``gpu``: skipped where no
CUDA device is visible. The same kernel's correctness at tiny shapes, every mask kind, is tests/unit/extract/
test_fused.py's (run it here too: on a GPU machine it runs the kernel compiled on CUDA tensors); these add what only
a GPU shows: half-precision inputs on the tensor cores at a real model's shapes, and memory linear in the length.
Speed against SDPA is a benchmark's (``python -m benchmarks.kernel_ratio``), not a test's."""

import pytest
import torch
from fused_reference import dense

pytestmark = pytest.mark.gpu


def _inputs(b, h, hk, t, d, dtype, lengths, size=32, seed=0):
    from rapids_attn.extract.fused import KernelInputs, pow2

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=g, device="cuda").to(dtype) for n in (h, hk, hk))
    ok = (torch.arange(t, device="cuda")[None] < torch.tensor(lengths, device="cuda")[:, None]).float()
    feat = torch.zeros(b, t, 16, device="cuda")
    feat[:, 0, 0] = 1.0
    feat[:, :, 3] = ok
    feat[:, :, 4] = torch.arange(t, device="cuda") * ok
    rt = torch.zeros(b, t, pow2(size), device="cuda")
    rt[..., :size] = torch.rand(b, t, size, generator=g, device="cuda") * ok[..., None]
    rw = torch.zeros(b, t, 8, device="cuda")
    rw[..., 0] = ok
    rw[..., 2] = ok
    return q, k, v, ok, KernelInputs(feat, rt, rw, size)


@pytest.mark.parametrize(("dtype", "precision"), [(torch.float16, "tf32"), (torch.bfloat16, "bf16")])
def test_bert_base_shapes_in_half_precision_agree_with_a_float64_reference(dtype, precision):
    """12 heads of 64 at 384 tokens, a padded batch of 4: the sums within the precision's bound of a float64
    reference over the same half-precision inputs, the output within half precision's."""
    from rapids_attn.extract.fused import PRECISION_RTOL, MaskSpec, fused_layer

    lengths = [384, 300, 129, 17]
    q, k, v, ok, inputs = _inputs(4, 12, 12, 384, 64, dtype, lengths)
    kv = torch.arange(12, device="cuda")
    spec = MaskSpec(ok.bool(), False, 0, 0)
    got, out = fused_layer(q, k, v, kv, spec, 0.125, inputs, precision=precision)
    sums, img, _, want, _ = dense(q, k, v, kv, ok.bool(), False, 0, 0, 0.125, inputs)
    tol = 4 * PRECISION_RTOL[precision]
    torch.testing.assert_close(got.sums.double(), sums, rtol=tol, atol=tol)
    torch.testing.assert_close(got.image.double(), img, rtol=tol, atol=tol)
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)


def test_a_llama_shaped_causal_layer_keeps_memory_linear_in_the_length():
    """32 query heads on 8 key heads of 128, causal, bfloat16: the kernel's own allocations (per-tile sums, one
    S x S image per tile, the log-sum-exp) grow linearly from 4k to 16k tokens, never with the square."""
    from rapids_attn.extract.fused import MaskSpec, fused_layer

    peaks = {}
    for t in (4096, 16384):
        q, k, v, _, inputs = _inputs(1, 32, 8, t, 128, torch.bfloat16, [t])
        kv = torch.arange(32, device="cuda") // 4
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        got, out = fused_layer(q, k, v, kv, MaskSpec(None, True, 0, 0), 128**-0.5, inputs)
        torch.cuda.synchronize()
        peaks[t] = torch.cuda.max_memory_allocated() - base
        assert torch.isfinite(got.sums).all() and torch.isfinite(out.float()).all()
        del q, k, v, got, out
    assert peaks[16384] <= 6 * peaks[4096], peaks  # 4x the length: about 4x (16x would be quadratic)
