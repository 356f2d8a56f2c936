"""Algorithm types: named bundles of components selected by ``algorithm.algorithm_type``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Type

from trinity.algorithm.advantage_fn import ADVANTAGE_FN
from trinity.algorithm.policy_loss_fn import POLICY_LOSS_FN
from trinity.common.experience import Experience
from trinity.common.registry import Registry

ALGORITHM_TYPE: Registry = Registry("algorithm_type", base=lambda: AlgorithmType)

# The data format algorithms declare as their ``schema`` (the developer guide's name).
ExperienceModel = Experience


class PairExperienceModel(Experience):
    """Schema of preference algorithms: batches of (chosen, rejected) rows, in that order.

    Algorithms declaring it read paired data (``chosen_key`` / ``rejected_key``) and must
    keep row order (``can_balance_batch = False``).
    """


class AlgorithmType:
    """What an algorithm needs from the trainer, and its default components.

    Every attribute has a default (the values of the developer guide's OPMD example), so a
    subclass states only where it differs.

    Class attributes:
        use_critic: train a value model (default False).
        use_reference: the algorithm may use a frozen reference model (default True; see
            ``needs_reference`` for when one is actually loaded).
        use_advantage: run the ``AdvantageFn``; False skips it (default True).
        can_balance_batch: rows may be reordered when splitting into micro-batches
            (default True).
        schema: the experience type it trains on (default ``ExperienceModel``).
        use_teacher: the trainer loads ``explorer.auxiliary_models[0]`` as a frozen teacher
            and fills ``teacher_logprob`` (default False; an extension of the guide's
            attributes).
    """

    use_critic: bool = False
    use_reference: bool = True
    use_advantage: bool = True
    can_balance_batch: bool = True
    schema: type = ExperienceModel
    use_teacher: bool = False

    @classmethod
    def default_config(cls) -> Dict:
        """``algorithm`` config keys this type sets where the user did not.

        The default is GRPO's components (the config's default ``algorithm_type``), so a
        type that only changes flags still names a complete set; override it to pick others.
        """
        return {
            "repeat_times": 2,
            "sample_strategy": "default",
            "policy_loss_fn": "ppo",
            "advantage_fn": "grpo",
            "kl_penalty_fn": "none",
            "kl_loss_fn": "k2",
            "entropy_loss_fn": "default",
        }


def _rl(**overrides: object) -> Dict:
    """GRPO-style defaults, with the overrides that make an algorithm what it is."""
    return {**AlgorithmType.default_config(), **overrides}


# The components of algorithms that train on data, not on rollouts: no advantage, no KL.
_SUPERVISED = {
    "sample_strategy": "default",
    "kl_penalty_fn": "none",
    "kl_loss_fn": "none",
    "entropy_loss_fn": "none",
}


@dataclass(frozen=True)
class BuiltinAlgorithm:
    """A built-in algorithm type as data: its class name (``trinity.algorithm.algorithm.<it>``
    is a dotted path configs may name), what it is, its defaults, the flags it changes."""

    class_name: str
    doc: str
    config: Dict[str, Any]
    flags: Dict[str, Any] = field(default_factory=dict)


# name -> the algorithm; each is registered as an ``AlgorithmType`` subclass of that name.
BUILTIN_ALGORITHMS: Dict[str, BuiltinAlgorithm] = {
    "grpo": BuiltinAlgorithm(
        "GRPOAlgorithm",
        "GRPO: group-normalised outcome advantages, PPO clipped loss, k2 KL loss.",
        _rl(),
    ),
    "grpo_verl": BuiltinAlgorithm(
        "GRPOverlAlgorithm",
        "GRPO under the original's other name (it computed the same advantages in the "
        "trainer process; here every algorithm's advantages are computed there).",
        _rl(),
    ),
    "sft": BuiltinAlgorithm(
        "SFTAlgorithm",
        "Supervised fine-tuning on the response tokens; no advantages, no KL (it names no "
        "advantage_fn: with use_advantage False none is ever built).",
        {"repeat_times": 1, "policy_loss_fn": "sft", **_SUPERVISED},
        {"use_reference": False, "use_advantage": False},
    ),
    "ppo": BuiltinAlgorithm(
        "PPOAlgorithm",
        "PPO with a learned critic: GAE advantages, clipped surrogate and clipped value loss.",
        _rl(repeat_times=1, advantage_fn="ppo"),
        {"use_critic": True},
    ),
    "opmd": BuiltinAlgorithm(
        "OPMDAlgorithm",
        "Online policy mirror descent.",
        _rl(sample_strategy="warmup", policy_loss_fn="opmd", advantage_fn="opmd"),
    ),
    "rloo": BuiltinAlgorithm(
        "RLOOAlgorithm",
        "REINFORCE leave-one-out: each sample's baseline is the mean of its group's others.",
        _rl(repeat_times=4, advantage_fn="rloo"),
    ),
    "reinforceplusplus": BuiltinAlgorithm(
        "ReinforcePlusPlusAlgorithm",
        "REINFORCE++: token-level KL penalty in the reward, batch-whitened returns.",
        _rl(
            repeat_times=1, advantage_fn="reinforceplusplus", kl_penalty_fn="k1", kl_loss_fn="none"
        ),
    ),
    "remax": BuiltinAlgorithm(
        "ReMaxAlgorithm",
        "ReMax: the baseline is the reward of a greedy response to the same prompt (built-in "
        "workflows produce it with workflow_args: {greedy_baseline: true}).",
        _rl(repeat_times=1, advantage_fn="remax", kl_loss_fn="none"),
    ),
    "dapo": BuiltinAlgorithm(
        "DAPOAlgorithm",
        "DAPO: asymmetric clipping, dynamic sampling of informative groups, token-mean loss, "
        "overlong reward shaping (sample_strategy_args), no KL.",
        _rl(
            repeat_times=8,
            sample_strategy="dapo",
            policy_loss_fn_args={"clip_range_low": 0.2, "clip_range_high": 0.28},
            loss_agg_mode="token-mean",
            kl_loss_fn="none",
            entropy_loss_fn="none",
        ),
    ),
    "drgrpo": BuiltinAlgorithm(
        "DrGRPOAlgorithm",
        "Dr. GRPO: GRPO without the std and length normalisations.",
        _rl(
            repeat_times=8,
            advantage_fn_args={"norm_adv_by_std_in_grpo": False},
            loss_agg_mode="seq-mean-token-sum-norm",
            kl_loss_fn="none",
        ),
    ),
    "gspo": BuiltinAlgorithm(
        "GSPOAlgorithm",
        "GSPO: sequence-level importance ratio, clipped per sequence.",
        _rl(
            repeat_times=8,
            policy_loss_fn="gspo",
            loss_agg_mode="seq-mean-token-mean",
            kl_loss_fn="none",
        ),
    ),
    "cispo": BuiltinAlgorithm(
        "CISPOAlgorithm",
        "CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio.",
        _rl(repeat_times=8, policy_loss_fn="cispo", kl_loss_fn="none"),
    ),
    "topr": BuiltinAlgorithm(
        "TOPRAlgorithm",
        "TOPR: tapered off-policy REINFORCE; plain REINFORCE on sequences with a positive "
        "advantage, a truncated importance weight on negative ones, no KL.",
        _rl(repeat_times=8, policy_loss_fn="topr", kl_loss_fn="none"),
    ),
    "asymre": BuiltinAlgorithm(
        "AsymREAlgorithm",
        "AsymRE: off-policy REINFORCE, advantage r - (group mean + baseline_shift) with the "
        "baseline below the mean; the loss is the plain weighted log-likelihood (OPMD's loss "
        "at tau 0), summed over each sequence as the paper's log pi(y); no KL.",
        _rl(
            repeat_times=8,
            advantage_fn="asymre",
            policy_loss_fn="opmd",
            policy_loss_fn_args={"tau": 0.0},
            loss_agg_mode="seq-mean-token-sum",
            kl_loss_fn="none",
        ),
    ),
    "gigpo": BuiltinAlgorithm(
        "GiGPOAlgorithm",
        "GiGPO: GRPO for multi-turn agents whose advantage adds, to the episode's group "
        "advantage, a step-level one comparing the turns that answered the same environment "
        "state (the workflow records turn_states); PPO clipped loss, k2 KL loss as GRPO.",
        _rl(repeat_times=8, advantage_fn="gigpo"),
    ),
    "rec": BuiltinAlgorithm(
        "RECAlgorithm",
        "REC: group-relative REINFORCE (r - group mean) with clipping as a token mask; the "
        "default variant is REC-OneSide-NoIS (no importance weight); no KL.",
        _rl(repeat_times=8, advantage_fn="rec", policy_loss_fn="rec", kl_loss_fn="none"),
    ),
    "sppo": BuiltinAlgorithm(
        "SPPOAlgorithm",
        "sPPO: the PPO surrogate of a softmax policy, A times the clipped log-ratio, on "
        "OPMD's group-mean advantages; no KL, no entropy bonus.",
        _rl(
            repeat_times=8,
            advantage_fn="opmd",
            policy_loss_fn="sppo",
            kl_loss_fn="none",
            entropy_loss_fn="none",
        ),
    ),
    "sapo": BuiltinAlgorithm(
        "SAPOAlgorithm",
        "SAPO: a smooth temperature-controlled gate of the importance ratio instead of "
        "PPO's hard clip, asymmetric for negative advantages; no KL.",
        _rl(repeat_times=8, policy_loss_fn="sapo", kl_loss_fn="none"),
    ),
    "m2po": BuiltinAlgorithm(
        "M2POAlgorithm",
        "M2PO: unclipped importance-weighted policy gradient, masking the batch's most "
        "off-policy tokens until the second moment of the log ratios is bounded; no KL.",
        _rl(repeat_times=8, policy_loss_fn="m2po", kl_loss_fn="none"),
    ),
    "mix": BuiltinAlgorithm(
        "MIXAlgorithm",
        "RL experiences plus expert SFT data (an auxiliary_buffers entry) in one loss.",
        _rl(repeat_times=8, sample_strategy="mix", policy_loss_fn="mix", entropy_loss_fn="mix"),
    ),
    "mix_chord": BuiltinAlgorithm(
        "MIXCHORDAlgorithm",
        "CHORD: RL experiences plus expert SFT data (an auxiliary_buffers entry), the SFT "
        "term weighted by a scheduled mu and token-wise by p(1 - p).",
        _rl(
            repeat_times=8,
            sample_strategy="mix",
            policy_loss_fn="mix_chord",
            entropy_loss_fn="mix",
        ),
    ),
    "on_policy_distill": BuiltinAlgorithm(
        "OnPolicyDistillAlgorithm",
        "On-policy distillation: the student samples, a teacher (explorer.auxiliary_models[0]) "
        "scores each sampled token, and the clipped policy gradient follows the teacher.",
        _rl(
            repeat_times=1,
            advantage_fn="on_policy_distill",
            kl_loss_fn="none",
            entropy_loss_fn="none",
        ),
        {"use_reference": False, "use_teacher": True},
    ),
    "jsd": BuiltinAlgorithm(
        "JSDAlgorithm",
        "On-policy distillation by the generalized Jensen-Shannon divergence (GKD's beta: "
        "advantage_fn_args.lambda_coef) between the teacher (explorer.auxiliary_models[0]) "
        "and the student on the student's samples.",
        _rl(repeat_times=1, advantage_fn="jsd", kl_loss_fn="none", entropy_loss_fn="none"),
        {"use_reference": False, "use_teacher": True},
    ),
    "dpo": BuiltinAlgorithm(
        "DPOAlgorithm",
        "Direct preference optimisation on (chosen, rejected) pairs against a frozen reference.",
        {"repeat_times": 2, "policy_loss_fn": "dpo", **_SUPERVISED},
        {"use_advantage": False, "can_balance_batch": False, "schema": PairExperienceModel},
    ),
}


def _register_builtin(name: str, spec: BuiltinAlgorithm) -> None:
    def default_config(cls: type) -> Dict:
        return copy.deepcopy(spec.config)  # callers may change what they get

    attrs = {"__doc__": spec.doc, "__module__": __name__, **spec.flags}
    attrs["default_config"] = classmethod(default_config)
    cls = type(spec.class_name, (AlgorithmType,), attrs)
    globals()[spec.class_name] = cls
    ALGORITHM_TYPE.register_module(name, cls)


for _name, _spec in BUILTIN_ALGORITHMS.items():
    _register_builtin(_name, _spec)


def needs_reference(
    algorithm_type: Type[AlgorithmType],
    kl_loss_fn: str,
    kl_penalty_fn: str,
    policy_loss_fn: Optional[str] = None,
) -> bool:
    """Whether the trainer must load a reference model and fill ``ref_logprob``.

    A reference is only read by a KL fn other than ``"none"`` or by a policy loss with a
    ``ref_logprob`` parameter, so GRPO with both KL fns set to ``"none"`` needs none.

    Raises:
        ValueError: a component needs reference logprobs but the algorithm declares
            ``use_reference = False`` (e.g. ``sft`` with ``kl_loss_fn: k2``).
    """
    users = [
        f"{key}: {name}"
        for key, name in (("kl_loss_fn", kl_loss_fn), ("kl_penalty_fn", kl_penalty_fn))
        if name != "none"
    ]
    loss_keys = POLICY_LOSS_FN.get(policy_loss_fn).select_keys if policy_loss_fn else ()
    if "ref_logprob" in loss_keys:
        users.append(f"policy_loss_fn: {policy_loss_fn}")
    if users and not algorithm_type.use_reference:
        raise ValueError(
            f"algorithm {algorithm_type.__name__} uses no reference model, but "
            f"{', '.join(users)} reads reference logprobs; change that setting "
            "or choose an algorithm that uses a reference model"
        )
    return bool(users)


def advantage_fn_class(config: Any) -> Optional[type]:
    """The advantage fn class the trainer will build, or None (the algorithm uses none, or a
    name is unknown: the config checks in trinity/preflight/derive.py report that)."""
    algorithm = config.algorithm
    if algorithm.advantage_fn is None or algorithm.algorithm_type not in ALGORITHM_TYPE:
        return None
    if not getattr(ALGORITHM_TYPE.get(algorithm.algorithm_type), "use_advantage", True):
        return None  # the advantage fn is never built
    try:
        return ADVANTAGE_FN.get(algorithm.advantage_fn)
    except KeyError:
        return None


def needs_groups(config: Any) -> bool:
    """Whether the algorithm's advantage fn compares the rollouts of one task (it declares
    ``needs_groups``), so batches must hold whole groups of ``repeat_times`` experiences."""
    return bool(getattr(advantage_fn_class(config), "needs_groups", False))
