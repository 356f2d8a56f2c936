"""Packed linears (trinity/ops/packed_linear.py): F.linear's results, packed again whenever
the weight changes, untouched where autograd or another dtype needs the plain path."""

import pytest
import torch
import torch.nn.functional as F

from trinity.ops import packed_linear


def layer(dtype: torch.dtype, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(48, 80, bias=bias).to(dtype)


DTYPES = [d for d in (torch.bfloat16, torch.float32) if packed_linear.available(d)]


def tolerance(dtype: torch.dtype, bias: bool) -> dict:
    """bf16 without bias: one oneDNN kernel either way, the same bits; with a bias, oneDNN adds
    it before rounding the sum once, F.linear after (one bf16 ulp apart). fp32: oneDNN against
    MKL, the sums in another order (a few float32 ulps of sums of size ~1)."""
    if dtype == torch.bfloat16:
        return dict(rtol=2**-7, atol=2**-7) if bias else dict(rtol=0, atol=0)
    return dict(rtol=0, atol=2e-5)


@pytest.fixture(params=[False, True], ids=["onednn", "mkl"])
def mkl(request, monkeypatch) -> bool:
    """Both machine kinds on any machine: fp32 reordered for oneDNN, or small fp32 weights
    plain for MKL (an Intel CPU, ``MKL_FP32``)."""
    monkeypatch.setattr(packed_linear, "MKL_FP32", request.param)
    return request.param


@pytest.mark.skipif(not DTYPES, reason="this torch build or CPU packs no dtype")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_packed_layers_compute_what_f_linear_does(dtype, bias, mkl):
    module = layer(dtype, bias)
    plain = module.weight.detach().clone(), None if module.bias is None else module.bias.detach()
    assert packed_linear.pack_linears(torch.nn.Sequential(module)) == 1
    x = torch.randn(6, 5, 48).to(dtype)
    with torch.inference_mode():
        for rows in (x, x[:, 0], x.transpose(0, 1), x[:0, 0]):  # 3D, 2D, strided, no rows
            got, want = module(rows), F.linear(rows, *plain)
            assert got.shape == want.shape and got.dtype == dtype
            torch.testing.assert_close(got, want, **tolerance(dtype, bias))


@pytest.mark.skipif(not DTYPES, reason="this torch build or CPU packs no dtype")
def test_a_changed_weight_is_packed_again(mkl):
    module, other = layer(DTYPES[0], seed=0), layer(DTYPES[0], seed=1)
    packed_linear.pack_linears(module)
    x = torch.randn(4, 48).to(DTYPES[0])
    with torch.inference_mode():
        first = module(x)
    with torch.no_grad():  # in place, as a weight sync writes
        module.weight.copy_(other.weight)
        module.bias.copy_(other.bias)
    with torch.inference_mode():
        torch.testing.assert_close(module(x), other(x), **tolerance(DTYPES[0], bias=True))
        assert not torch.equal(module(x), first)
    module.weight.data = other.weight.data.clone() * 2  # new memory, as released weights get
    with torch.inference_mode():
        want = F.linear(x, module.weight, module.bias)
        torch.testing.assert_close(module(x), want, **tolerance(DTYPES[0], bias=True))
    packed_linear.forget(module)
    assert module._trinity_packed.weight is None
    with torch.inference_mode():  # packed again at the next call
        want = F.linear(x, module.weight, module.bias)
        torch.testing.assert_close(module(x), want, **tolerance(DTYPES[0], bias=True))


@pytest.mark.skipif(not DTYPES, reason="this torch build or CPU packs no dtype")
def test_autograd_and_other_dtypes_take_f_linear():
    module = layer(torch.float32)
    packed_linear.pack_linears(module)
    x = torch.randn(3, 48, requires_grad=True)
    out = module(x)  # grad enabled, a weight that requires grad: differentiable as before
    out.sum().backward()
    assert module.weight.grad is not None and x.grad is not None
    assert module._trinity_packed.weight is None  # nothing was packed for it
    with torch.inference_mode():  # weights without a version counter are not packed
        module.weight.data = torch.randn(80, 48)
        assert module.weight.is_inference()
        torch.testing.assert_close(module(x), F.linear(x, module.weight, module.bias))
    assert module._trinity_packed.weight is None
    half = torch.nn.Linear(48, 8).half()
    assert packed_linear.pack_linears(half) == 0  # a dtype it does not pack stays plain
    assert "forward" not in vars(half)


@pytest.mark.skipif(
    torch.float32 not in DTYPES, reason="this torch build or CPU has no fp32 oneDNN"
)
@pytest.mark.parametrize("frozen", [False, True])
def test_routed_layers_train_as_f_linear_does(frozen, monkeypatch):
    """The trainer's fp32 route: the same outputs and gradients as F.linear (fp32 sums in
    another order), the weight's left alone when it is frozen (LoRA's base, a reference)."""
    monkeypatch.setattr(packed_linear, "MKL_FP32", False)
    routed, plain = layer(torch.float32), layer(torch.float32)
    routed.requires_grad_(not frozen), plain.requires_grad_(not frozen)
    assert packed_linear.route_linears(torch.nn.Sequential(routed)) == 1
    x = torch.randn(3, 7, 48)
    inputs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [routed(inputs[0]), plain(inputs[1])]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=2e-5)
    weights = torch.randn(3, 7, 80)  # a loss that weighs every output differently
    for out in outs:
        (out * weights).sum().backward()
    torch.testing.assert_close(inputs[0].grad, inputs[1].grad, rtol=0, atol=2e-5)
    for got, want in ((routed.weight, plain.weight), (routed.bias, plain.bias)):
        assert (got.grad is None) is frozen
        if not frozen:
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(
    torch.float32 not in DTYPES, reason="this torch build or CPU has no fp32 oneDNN"
)
def test_routed_layers_leave_autocast_to_f_linear(monkeypatch):
    monkeypatch.setattr(packed_linear, "MKL_FP32", False)
    module = layer(torch.float32)
    packed_linear.route_linears(module)
    x = torch.randn(4, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = module(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = F.linear(x, module.weight, module.bias)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


@pytest.mark.skipif(not DTYPES, reason="this torch build or CPU packs no dtype")
def test_where_mkl_is_fast_small_fp32_weights_stay_plain(monkeypatch):
    """On an Intel CPU (``MKL_FP32``): fp32 weights up to ``PLAIN_FP32_NUMEL`` elements are
    read plain by F.linear (no copy: the same bits, the same memory), larger ones and bf16
    are reordered for oneDNN, and the trainer's layers are not routed."""
    monkeypatch.setattr(packed_linear, "MKL_FP32", True)
    small, large = layer(torch.float32, seed=0), layer(torch.float32, seed=1)
    x = torch.randn(5, 48)
    packed_linear.pack_linears(torch.nn.Sequential(small, large))
    monkeypatch.setattr(packed_linear, "PLAIN_FP32_NUMEL", 48 * 80)
    with torch.inference_mode():
        assert torch.equal(small(x), F.linear(x, small.weight, small.bias))
    assert not small._trinity_packed.reordered
    assert small._trinity_packed.weight.data_ptr() == small.weight.data_ptr()
    monkeypatch.setattr(packed_linear, "PLAIN_FP32_NUMEL", 48 * 80 - 1)
    with torch.inference_mode():
        torch.testing.assert_close(
            large(x), F.linear(x, large.weight, large.bias), rtol=0, atol=2e-5
        )
    assert large._trinity_packed.reordered
    assert packed_linear.route_linears(layer(torch.float32)) == 0
    if torch.bfloat16 in DTYPES:
        half = layer(torch.bfloat16)
        packed_linear.pack_linears(half)
        with torch.inference_mode():
            half(x.bfloat16())
        assert half._trinity_packed.reordered
