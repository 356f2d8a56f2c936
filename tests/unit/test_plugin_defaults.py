"""Plugins that omit what the developer guide lists still run: the base classes' defaults,
and the group declaration of advantage functions."""

from typing import Dict

import pytest
import torch

from tests.unit.test_dataproto_view import group_experiences, make_trainer
from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    KL_FN,
    POLICY_LOSS_FN,
    AdvantageFn,
    AlgorithmType,
    ExperienceModel,
    KLFn,
    needs_reference,
)
from trinity.common.config import Config
from trinity.common.config.base import validate_model
from trinity.preflight.validate import buffer_component_problems


@pytest.fixture
def algorithm_registry(monkeypatch):
    """ALGORITHM_TYPE with the test's registrations dropped afterwards."""
    monkeypatch.setattr(ALGORITHM_TYPE, "_modules", dict(ALGORITHM_TYPE._modules))
    return ALGORITHM_TYPE


def test_algorithm_type_defaults_are_the_guide_opmd_flags():
    class Bare(AlgorithmType):
        pass

    assert (Bare.use_critic, Bare.use_reference, Bare.use_advantage) == (False, True, True)
    assert Bare.can_balance_batch is True and Bare.use_teacher is False
    assert Bare.schema is ExperienceModel
    # default_config names a complete, registered set of components (GRPO's)
    config = Bare.default_config()
    assert config == ALGORITHM_TYPE.get("grpo").default_config()
    assert config["advantage_fn"] in ADVANTAGE_FN and config["policy_loss_fn"] in POLICY_LOSS_FN
    assert config["kl_loss_fn"] in KL_FN
    assert needs_reference(Bare, config["kl_loss_fn"], config["kl_penalty_fn"]) is True


def test_guide_opmd_without_schema_trains_a_step(
    tmp_path, micro_model, arithmetic_data, algorithm_registry
):
    """The issue's case: the guide's OPMD AlgorithmType with ``schema`` (and the other flags
    it sets to their defaults) left out used to die with AttributeError in the trainer."""

    @algorithm_registry.register_module("opmd_no_schema")
    class OPMDAlgorithm(AlgorithmType):
        use_critic: bool = False

        @classmethod
        def default_config(cls) -> Dict:
            return {
                "repeat_times": 4,
                "sample_strategy": "warmup",
                "policy_loss_fn": "opmd",
                "advantage_fn": "opmd",
                "kl_penalty_fn": "none",
                "kl_loss_fn": "k2",
                "entropy_loss_fn": "default",
            }

    trainer = make_trainer(
        tmp_path, micro_model, arithmetic_data, {"algorithm_type": "opmd_no_schema"}
    )
    assert trainer.ref_model is not None and trainer.teacher is None
    metrics = trainer.train_step(group_experiences(trainer.tokenizer))
    assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))
    assert "actor/kl_loss" in metrics and "actor/opmd_loss" in metrics


def test_needs_groups_is_declared_by_the_group_based_advantages():
    grouped = {name for name in ADVANTAGE_FN if ADVANTAGE_FN.get(name).needs_groups}
    assert grouped == {
        "asymre",
        "clipb",
        "gigpo",
        "grpo",
        "opmd",
        "rec",
        "rloo",
        "reinforceplusplus_baseline",
    }
    by_turn = {name for name in ADVANTAGE_FN if ADVANTAGE_FN.get(name).needs_turn_states}
    assert by_turn == {"gigpo"}
    by_scores = {name for name in ADVANTAGE_FN if ADVANTAGE_FN.get(name).needs_policy_scores}
    assert by_scores == {"clipb"}


def test_needs_groups_defaults_to_false_for_a_plugin():
    class MyAdvantage(AdvantageFn):
        def __call__(self, exps, **kwargs):
            return exps, {}

    assert MyAdvantage.needs_groups is False
    assert MyAdvantage.needs_turn_states is False
    assert MyAdvantage.needs_policy_scores is False


def test_kl_fn_without_super_init_has_a_coefficient():
    class L1(KLFn):
        def __init__(self, scale: float = 1.0) -> None:
            self.scale = scale  # no super().__init__: kl_coef falls back to 0.001

        def calculate_kl(self, logprob, ref_logprob):
            return self.scale * (logprob - ref_logprob).abs()

    loss, metrics = L1().calculate_kl_loss(
        torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    )
    # token-mean of |0.5|, |-1| = 0.75, times 0.001
    assert loss.item() == pytest.approx(0.00075)
    assert metrics == {"kl_loss": pytest.approx(0.75), "kl_coef": 0.001}


def test_unknown_task_selector_is_a_config_error_naming_the_key():
    taskset = {"name": "a", "path": "/data", "task_selector": {"selector_type": "shufle"}}
    config = validate_model(Config, {"buffer": {"explorer_input": {"taskset": taskset}}})
    (problem,) = buffer_component_problems(config)
    assert problem.startswith("buffer.explorer_input.tasksets[0].task_selector.selector_type: ")
    assert "did you mean 'shuffle'?" in problem


def test_components_a_plugin_type_leaves_out_take_the_global_defaults(algorithm_registry):
    from trinity.preflight.derive import derive

    @algorithm_registry.register_module("only_loss")
    class OnlyLoss(AlgorithmType):
        @classmethod
        def default_config(cls) -> Dict:
            return {"policy_loss_fn": "ppo"}  # no sample_strategy, advantage_fn, KL, entropy

    config, _ = derive(validate_model(Config, {"algorithm": {"algorithm_type": "only_loss"}}))
    base = AlgorithmType.default_config()
    for key in ("sample_strategy", "advantage_fn", "kl_loss_fn", "entropy_loss_fn"):
        assert getattr(config.algorithm, key) == base[key]
    assert config.algorithm.repeat_times == base["repeat_times"]


def test_sft_names_no_advantage_function():
    from trinity.preflight.derive import derive

    config, _ = derive(validate_model(Config, {"algorithm": {"algorithm_type": "sft"}}))
    assert config.algorithm.advantage_fn is None and config.algorithm.sample_strategy == "default"
