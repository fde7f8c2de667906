"""bench/gpu_check.py off the GPU: the q comparison counts grid steps right, the precision switch
the backbones use on CUDA exists, and without CUDA the script refuses (exit 2) instead of passing
a CPU run off as a GPU one."""

from __future__ import annotations

import numpy as np
import pytest

from bench import gpu_check


def test_compare_q_counts_rows_and_grid_steps() -> None:
    rng = np.random.default_rng(0)
    F = rng.standard_normal((5, 16)).astype(np.float32)
    same = gpu_check.compare_q(F, F.copy(), 30)
    assert same["rows_identical"] == 5 and same["max_steps"] == 0 and same["max_abs_float_diff"] == 0.0
    G = F.copy()
    G[2] *= np.float32(1.0 + 1e-3)  # a scaled row normalizes to (almost) the same q
    G[3, 0] += np.float32(1e-2)  # a moved component does not
    got = gpu_check.compare_q(F, G, 30)
    assert got["rows_differing"] >= 1 and got["rows_identical"] <= 4
    assert got["max_steps"] > 1000  # 1e-2 on a unit-scale vector is millions of 2^-30 steps
    assert got["max_abs_float_diff"] == pytest.approx(1e-2, rel=1e-3)


def test_without_cuda_the_check_refuses() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: this is the no-GPU behaviour")
    assert gpu_check.main(["--images", "4", "--texts", "4"]) == 2


def test_full_fp32_switch_turns_tf32_off() -> None:
    torch = pytest.importorskip("torch")
    from unlearn.features.backbones.registry import full_fp32_on_cuda

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        full_fp32_on_cuda()
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
