"""Fixed and adaptive KL controllers, and building them from a veRL kl_ctrl dict."""

import pytest

from trinity.algorithm.kl_fn.controller import (
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
)


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=1.0, n_steps=100)
    assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=1000)
    # KL 0.11: error = 0.11/0.1 - 1 = 0.1; factor 1 + 0.1 * 100/1000 = 1.01 -> 0.202
    ctrl.update(current_kl=0.11, n_steps=100)
    assert ctrl.value == pytest.approx(0.202)
    # KL 1.0: error 9 clipped to 0.2; factor 1 + 0.2 * 500/1000 = 1.1 -> 0.2222
    ctrl.update(current_kl=1.0, n_steps=500)
    assert ctrl.value == pytest.approx(0.2222)
    # KL 0: error -1 clipped to -0.2; factor 1 - 0.2 * 250/1000 = 0.95 -> 0.21109
    ctrl.update(current_kl=0.0, n_steps=250)
    assert ctrl.value == pytest.approx(0.21109)


def test_state_dict_round_trip():
    ctrl = AdaptiveKLController(0.2, 0.1, 1000)
    ctrl.update(1.0, 500)  # -> 0.22
    fresh = AdaptiveKLController(0.2, 0.1, 1000)
    fresh.load_state_dict(ctrl.state_dict())
    assert fresh.value == pytest.approx(0.22)


def test_build_from_verl_dict():
    fixed = build_kl_controller(None, kl_coef=0.001)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.001
    assert build_kl_controller({"type": "fixed", "kl_coef": 0.005}, 0.001).value == 0.005
    adaptive = build_kl_controller(
        {"type": "adaptive", "kl_coef": 0.3, "target_kl": 0.5, "horizon": 10}, 0.001
    )
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.3, 0.5, 10)
    # Missing keys: kl_coef from the argument, veRL's defaults target 0.1, horizon 10000.
    default = build_kl_controller({"type": "adaptive"}, 0.02)
    assert (default.value, default.target, default.horizon) == (0.02, 0.1, 10000)


def test_build_rejects_bad_config():
    with pytest.raises(ValueError, match="unknown kl_ctrl type"):
        build_kl_controller({"type": "pid"}, 0.001)
    with pytest.raises(ValueError, match="target_kl"):
        build_kl_controller({"type": "adaptive", "target_kl": 0.0}, 0.001)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0)
