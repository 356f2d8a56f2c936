"""Algorithm types, needs_reference, the default sample strategy and the guide's OPMD example."""

from typing import Dict, Tuple

import pytest
import torch

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
    AdvantageFn,
    AlgorithmType,
    PolicyLossFn,
    needs_reference,
)
from trinity.algorithm.algorithm import ExperienceModel
from trinity.algorithm.utils import masked_mean
from trinity.common.experience import Experience


def test_registry_names():
    assert ALGORITHM_TYPE.names() == sorted(
        ["asymre", "cispo", "dapo", "dpo", "drgrpo", "gigpo", "grpo", "gspo", "jsd", "m2po", "mix"]
        + ["mix_chord", "on_policy_distill", "opmd", "ppo", "rec", "reinforceplusplus"]
        + ["remax", "rloo", "sapo", "sft", "sppo", "topr", "grpo_verl"]
    )
    # the original's other name for GRPO: the same components
    assert (
        ALGORITHM_TYPE.get("grpo_verl").default_config()
        == ALGORITHM_TYPE.get("grpo").default_config()
    )
    assert ADVANTAGE_FN.names() == sorted(
        ["asymre", "clipb", "gigpo", "grpo", "jsd", "on_policy_distill", "opmd", "ppo", "rec"]
        + ["reinforceplusplus", "reinforceplusplus_baseline", "remax", "rloo"]
    )
    assert POLICY_LOSS_FN.names() == sorted(
        ["cispo", "dpo", "gspo", "m2po", "mix", "mix_chord", "opmd", "ppo", "rec", "sapo"]
        + ["sft", "sft_phi", "sppo", "topr"]
    )
    assert ENTROPY_LOSS_FN.names() == ["default", "mix", "none"]
    assert SAMPLE_STRATEGY.names() == ["dapo", "default", "mix", "staleness_control", "warmup"]
    assert "k2" in KL_FN


def test_grpo_and_sft_types():
    grpo, sft = ALGORITHM_TYPE.get("grpo"), ALGORITHM_TYPE.get("sft")
    assert grpo.default_config() == {
        "repeat_times": 2,
        "sample_strategy": "default",
        "policy_loss_fn": "ppo",
        "advantage_fn": "grpo",
        "kl_penalty_fn": "none",
        "kl_loss_fn": "k2",
        "entropy_loss_fn": "default",
    }
    assert (grpo.use_critic, grpo.use_reference, grpo.use_advantage) == (False, True, True)
    assert sft.default_config()["policy_loss_fn"] == "sft"
    assert sft.default_config()["repeat_times"] == 1
    assert (sft.use_critic, sft.use_reference, sft.use_advantage) == (False, False, False)
    assert grpo.schema is Experience and sft.schema is ExperienceModel
    # Every component a type names is registered.
    registries = {
        "sample_strategy": SAMPLE_STRATEGY,
        "policy_loss_fn": POLICY_LOSS_FN,
        "advantage_fn": ADVANTAGE_FN,
        "kl_penalty_fn": KL_FN,
        "kl_loss_fn": KL_FN,
        "entropy_loss_fn": ENTROPY_LOSS_FN,
    }
    for algo in (grpo, sft):
        for key, name in algo.default_config().items():
            if key in registries:
                assert name in registries[key], (algo, key, name)


def test_needs_reference():
    grpo, sft = ALGORITHM_TYPE.get("grpo"), ALGORITHM_TYPE.get("sft")
    assert needs_reference(grpo, "k2", "none") is True
    assert needs_reference(grpo, "none", "k1") is True
    assert needs_reference(grpo, "none", "none") is False
    assert needs_reference(sft, "none", "none") is False
    with pytest.raises(ValueError, match="kl_loss_fn: k2"):
        needs_reference(sft, "k2", "none")


def test_needs_reference_for_a_loss_reading_ref_logprob():
    class RefLoss(PolicyLossFn):
        def __call__(self, logprob, ref_logprob, action_mask, **kwargs):  # type: ignore
            return masked_mean(logprob - ref_logprob, action_mask), {}

    POLICY_LOSS_FN.register_module("test_ref_loss", RefLoss)
    try:
        grpo = ALGORITHM_TYPE.get("grpo")
        assert needs_reference(grpo, "none", "none", policy_loss_fn="test_ref_loss") is True
        assert needs_reference(grpo, "none", "none", policy_loss_fn="ppo") is False
    finally:
        POLICY_LOSS_FN._modules.pop("test_ref_loss")  # keep the shared registry clean


class FakeReader:
    """A buffer of experiences read in order; StopIteration once empty."""

    def __init__(self, n: int):
        self.exps = [Experience([1, 2], 1, reward=1.0, model_version=i % 3) for i in range(n)]
        self.timeouts = []

    def read(self, batch_size, timeout=None):
        self.timeouts.append(timeout)
        if not self.exps:
            raise StopIteration
        batch, self.exps = self.exps[:batch_size], self.exps[batch_size:]
        return batch


def test_default_sample_strategy_reads_batches_in_order():
    reader = FakeReader(5)
    first, rest = reader.exps[:3], reader.exps[3:]
    strategy = SAMPLE_STRATEGY.get("default")(reader, timeout=7.5)
    exps, metrics = strategy.sample(step=1, batch_size=3)
    assert exps == first
    assert metrics == {
        "sample/experience_count": 3.0,
        "sample/model_version/mean": 1.0,
        "sample/model_version/min": 0.0,
        "sample/model_version/max": 2.0,
    }
    exps, metrics = strategy.sample(step=2, batch_size=3)  # the buffer closes: a short batch
    assert exps == rest
    assert metrics["sample/experience_count"] == 2.0
    with pytest.raises(StopIteration):
        strategy.sample(step=3, batch_size=3)
    assert reader.timeouts == [7.5, 7.5, 7.5]


def test_default_sample_strategy_state():
    strategy = SAMPLE_STRATEGY.get("default")(FakeReader(1))
    assert strategy.state_dict() == {}
    strategy.load_state_dict({})
    with pytest.raises(ValueError, match="another sample_strategy"):
        strategy.load_state_dict({"cursor": 3})


@pytest.fixture
def guide_opmd():
    """The developer guide's OPMD components and AlgorithmType, registered as it writes them
    (the advantage body, elided in the guide, is a plain mean baseline here); unregistered
    afterwards so other tests see the shared registries unchanged."""

    saved = {r: r.get("opmd") for r in (ADVANTAGE_FN, POLICY_LOSS_FN, ALGORITHM_TYPE)}

    @ADVANTAGE_FN.register_module("opmd")
    class OPMDAdvantageFn(AdvantageFn):
        """OPMD advantage computation"""

        def __init__(
            self,
            opmd_baseline: str = "mean",
            tau: float = 1.0,
        ) -> None:
            self.opmd_baseline = opmd_baseline
            self.tau = tau

        def __call__(
            self,
            exps,
            **kwargs,
        ) -> Tuple[object, Dict]:
            # calculate advantages and returns based on the exps
            seq = exps.rewards - exps.rewards.mean()
            exps.advantages = seq.unsqueeze(-1) * exps.action_mask
            exps.returns = exps.advantages
            # record some metrics
            metrics = {"opmd/baseline": exps.rewards.mean().item()}
            return exps, metrics

        @classmethod
        def default_args(cls) -> Dict:
            return {
                "opmd_baseline": "mean",
                "tau": 1.0,
            }

    @POLICY_LOSS_FN.register_module("opmd")
    class OPMDPolicyLossFn(PolicyLossFn):
        def __init__(self, tau: float = 1.0) -> None:
            self.tau = tau

        def __call__(  # type: ignore
            self,
            logprob: torch.Tensor,
            action_mask: torch.Tensor,
            advantages: torch.Tensor,
            **kwargs,
        ) -> Tuple[torch.Tensor, Dict]:
            pg_losses = -advantages * logprob
            opmd_loss = masked_mean(pg_losses, action_mask)
            opmd_loss = opmd_loss / (1.0 + self.tau)  # for regularization (w.r.t. current pi_theta)
            return opmd_loss, {"opmd_loss": opmd_loss.detach().item()}

        @classmethod
        def default_args(cls) -> Dict:
            return {"tau": 1.0}

    @ALGORITHM_TYPE.register_module("opmd")
    class OPMDAlgorithm(AlgorithmType):
        """OPMD algorithm."""

        use_critic: bool = False
        use_reference: bool = True
        use_advantage: bool = True
        can_balance_batch: bool = True
        schema: type = ExperienceModel

        @classmethod
        def default_config(cls) -> Dict:
            return {
                "repeat_times": 2,
                "sample_strategy": "warmup",
                "policy_loss_fn": "opmd",
                "advantage_fn": "opmd",
                "kl_penalty_fn": "none",
                "kl_loss_fn": "k2",
                "entropy_loss_fn": "default",
            }

    yield
    for registry, builtin in saved.items():
        registry._modules["opmd"] = builtin


def test_guide_opmd_algorithm_registers_and_configures(guide_opmd):
    algo = ALGORITHM_TYPE.get("opmd")
    config = algo.default_config()
    assert config["policy_loss_fn"] == "opmd" and config["kl_loss_fn"] == "k2"
    assert needs_reference(algo, config["kl_loss_fn"], config["kl_penalty_fn"]) is True
    adv_cls = ADVANTAGE_FN.get(config["advantage_fn"])
    adv_fn = adv_cls(**adv_cls.default_args())
    assert adv_fn.tau == 1.0
    loss_cls = POLICY_LOSS_FN.get(config["policy_loss_fn"])
    assert loss_cls.select_keys == ("logprob", "action_mask", "advantages")
    loss, metrics = loss_cls(**loss_cls.default_args())(
        logprob=torch.tensor([[-2.0]]), action_mask=torch.ones(1, 1), advantages=torch.ones(1, 1)
    )
    assert loss.item() == pytest.approx(1.0)  # -1 * -2 / (1 + tau)
    assert metrics == {"opmd_loss": pytest.approx(1.0)}


def test_guide_example_is_cleaned_up():
    # the guide's classes replaced the built-ins (plugins may) and the fixture restored them
    for registry in (ADVANTAGE_FN, POLICY_LOSS_FN, ALGORITHM_TYPE):
        assert registry.get("opmd").__module__.startswith("trinity.algorithm")
