"""The brgemm linear computes what F.linear computes; a runner compiled for bfloat16 on a CPU
with AMX runs its linears on it and gives the plain model's logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wok_runtime.core.loader import load_model, resolve_source
from wok_runtime.core.model import CausalAttention, Linear
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.kernels import brgemm_linear

pytestmark = pytest.mark.usefixtures("one_torch_thread")

AMX = torch.cpu._is_amx_tile_supported()


@pytest.fixture(scope="module")
def built() -> bool:
    """Built where there is AMX (the C++ toolchain `--compile` needs is here); never without."""
    loaded = brgemm_linear.load()
    assert loaded == AMX, "built on every CPU with AMX and on no other"
    return loaded


@pytest.mark.parametrize(
    ("out_features", "in_features", "bias"), [(64, 48, True), (960, 576, False), (96, 1376, True)]
)
def test_the_kernel_computes_f_linear_sums(
    built: bool, out_features: int, in_features: int, bias: bool
) -> None:
    """fp32 sums rounded once to bf16: within one rounding of the exact product, for empty,
    single-row, odd and multi-block (over 128 rows) inputs."""
    if not built:
        assert not AMX
        return
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features).bfloat16()
    b = torch.randn(out_features).bfloat16() if bias else None
    packed = brgemm_linear.pack(weight)
    for rows in (0, 1, 7, 32, 129, 300):
        x = torch.randn(rows, in_features).bfloat16()
        got = brgemm_linear.linear(x, packed, b)
        assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
        exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
        # One bf16 rounding (2^-9 relative) plus fp32 summation order.
        torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-4)


def test_fits_asks_for_whole_blocks() -> None:
    assert brgemm_linear.fits(960, 576)
    assert not brgemm_linear.fits(48, 64)  # 48 outputs: one and a half blocks
    assert not brgemm_linear.fits(64, 47)  # inputs go in pairs


def test_a_linear_moves_onto_brgemm_from_either_layout(built: bool) -> None:
    """From its plain weight or from oneDNN's packing, one copy stays (the plain weight only
    where it is kept for a tied embedding) and the outputs are the plain linear's."""
    if not built:
        assert not AMX
        return
    torch.manual_seed(1)
    x = torch.randn(5, 64).bfloat16()
    for first_packed in (False, True):
        linear = Linear(64, 96, bias=True).bfloat16()
        with torch.no_grad():
            linear.weight.copy_(torch.randn(96, 64))
            linear.bias.copy_(torch.randn(96))
        expected = F.linear(x, linear.weight, linear.bias)
        if first_packed:
            linear.pack()
        linear.pack_for_brgemm()
        assert linear.packed is None and linear.weight.numel() == 0
        torch.testing.assert_close(linear(x), expected, rtol=2**-8, atol=1e-4)
    tied = Linear(64, 96).bfloat16()
    tied.pack_for_brgemm(keep_weight=True)
    assert tied.weight.shape == (96, 64)


def test_a_compiled_bf16_runner_runs_its_linears_on_brgemm(built: bool) -> None:
    """`--compile` on a CPU with AMX moves every linear of builtin:tiny onto brgemm; a prefill of
    128 rows and a decode step (the compiled step, where the kernel is a custom op) give the
    plain bf16 model's logits."""
    runner = ModelRunner.from_source(
        "builtin:tiny", kv_cache_bytes=1 << 22, dtype="bfloat16", block_size=16, compile=True
    )
    linears = runner.model.linears()
    if not built:
        assert all(m.brgemm_packed is None for m in linears)
        return
    assert all(m.brgemm_packed is not None and m.packed is None for m in linears)
    torch.manual_seed(2)
    ids = torch.randint(10, runner.config.vocab_size, (129,)).tolist()
    prefill = runner.forward([StepInput(ids[:128], 0, list(range(8)))])[0]
    decode = runner.forward([StepInput(ids[128:], 128, list(range(9)))])[0]
    plain = load_model(
        resolve_source("builtin:tiny"), dtype=torch.bfloat16, device=torch.device("cpu")
    )
    with torch.inference_mode():
        hidden = plain(torch.tensor(ids), torch.arange(len(ids)), CausalAttention())
        reference = plain.logits(hidden[[127, 128]])
    for got, want in zip((prefill, decode), reference, strict=True):
        assert got.argmax() == want.argmax()
        assert (got - want).abs().max() < 0.1
