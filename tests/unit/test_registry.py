import subprocess
from typing import Any, Dict, Optional

import pytest

from trinity.algorithm import (
    ADVANTAGE_FN,
    ALGORITHM_TYPE,
    ENTROPY_LOSS_FN,
    KL_FN,
    POLICY_LOSS_FN,
    SAMPLE_STRATEGY,
)
from trinity.algorithm.advantage_fn.base import AdvantageFn
from trinity.algorithm.algorithm import AlgorithmType
from trinity.algorithm.entropy_loss_fn.base import EntropyLossFn
from trinity.algorithm.kl_fn.base import KLFn
from trinity.algorithm.policy_loss_fn.base import PolicyLossFn
from trinity.algorithm.sample_strategy.base import SampleStrategy
from trinity.buffer.selector import TASK_SELECTORS, Selector
from trinity.common.registry import Registry
from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn
from trinity.common.workflows import WORKFLOWS, Workflow
from trinity.monitor.monitor import MONITORS, MetricSink

REGISTRIES = [
    (WORKFLOWS, Workflow),
    (REWARD_FUNCTIONS, RewardFn),
    (ADVANTAGE_FN, AdvantageFn),
    (POLICY_LOSS_FN, PolicyLossFn),
    (KL_FN, KLFn),
    (ENTROPY_LOSS_FN, EntropyLossFn),
    (SAMPLE_STRATEGY, SampleStrategy),
    (ALGORITHM_TYPE, AlgorithmType),
    (MONITORS, MetricSink),
    (TASK_SELECTORS, Selector),
]


class DottedReward(RewardFn):
    """A reward a config names by dotted path, never registered."""

    def __call__(self, response: str, truth: Optional[str] = None, **kw: Any) -> Dict[str, float]:
        return {"accuracy": 1.0}


@pytest.mark.parametrize("registry, base", REGISTRIES, ids=lambda r: getattr(r, "name", ""))
def test_every_builtin_is_a_subclass_of_its_base_and_resolves_by_dotted_path(registry, base):
    assert registry.names(), registry.name
    for name in registry.names():
        cls = registry.get(name)
        assert isinstance(cls, type) and issubclass(cls, base), (registry.name, name)
        assert registry.get(f"{cls.__module__}.{cls.__qualname__}") is cls


@pytest.mark.parametrize("registry, base", REGISTRIES, ids=lambda r: getattr(r, "name", ""))
@pytest.mark.parametrize("path", ["subprocess.Popen", "os.system", "builtins.eval"])
def test_dotted_paths_to_other_objects_are_refused(registry, base, path):
    expected = (
        f"{registry.name}: '{path}' is not a {base.__name__} subclass; register plugins in a "
        f"--plugin-dir module or name a {base.__name__} subclass"
    )
    with pytest.raises(KeyError) as info:
        registry.get(path)
    assert info.value.args[0] == expected


def test_the_refused_object_is_never_called(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: calls.append(a))
    with pytest.raises(KeyError, match="is not a RewardFn subclass"):
        REWARD_FUNCTIONS.get("subprocess.Popen")
    assert calls == []


def test_a_dotted_subclass_resolves():
    assert REWARD_FUNCTIONS.get(f"{__name__}.DottedReward") is DottedReward
    with pytest.raises(KeyError, match="is not a Workflow subclass"):
        WORKFLOWS.get(f"{__name__}.DottedReward")  # a class, but of another kind


def test_unimportable_paths_and_unknown_names_say_so():
    with pytest.raises(KeyError, match="cannot import 'no_such_module.Thing'"):
        REWARD_FUNCTIONS.get("no_such_module.Thing")
    with pytest.raises(KeyError, match="did you mean 'math_reward'"):
        REWARD_FUNCTIONS.get("math_rewrd")


def test_a_registry_without_base_takes_registered_names_only():
    reg: Registry = Registry("things")
    reg.register_module("a", DottedReward)
    assert reg.get("a") is DottedReward
    with pytest.raises(KeyError, match="things: 'collections.OrderedDict' is not a registered"):
        reg.get("collections.OrderedDict")


def test_the_base_may_be_defined_after_the_registry():
    reg: Registry = Registry("late", base=lambda: Late)

    class Late:
        pass

    globals()["_LateChild"] = type("_LateChild", (Late,), {"__module__": __name__})
    try:
        assert reg.get(f"{__name__}._LateChild") is globals()["_LateChild"]
        with pytest.raises(KeyError, match="is not a Late subclass"):
            reg.get(f"{__name__}.DottedReward")
    finally:
        del globals()["_LateChild"]


def test_registered_plugins_are_returned_as_registered(monkeypatch):
    monkeypatch.setattr(REWARD_FUNCTIONS, "_modules", dict(REWARD_FUNCTIONS._modules))
    REWARD_FUNCTIONS.register_module("dotted_reward", DottedReward)
    assert REWARD_FUNCTIONS.get("dotted_reward") is DottedReward


def test_selector_config_with_a_dotted_non_selector_is_refused():
    from types import SimpleNamespace

    from trinity.buffer.selector import build_selector

    config = SimpleNamespace(selector_type="os.system", seed=1)
    with pytest.raises(ValueError) as info:
        build_selector(config)
    assert str(info.value).startswith(
        "task_selector.selector_type = 'os.system': task_selectors: 'os.system' is not a "
        "Selector subclass"
    )


@pytest.mark.parametrize(
    "registry, wrong, right",
    [(WORKFLOWS, "math_workfow", "math_workflow"), (REWARD_FUNCTIONS, "math_rewrd", "math_reward")],
    ids=["workflow", "reward"],
)
def test_an_unknown_name_gets_the_closest_name_and_how_a_plugin_joins(registry, wrong, right):
    with pytest.raises(KeyError) as info:
        registry.get(wrong)
    assert info.value.args[0] == (
        f"{registry.name} has no module named '{wrong}'; did you mean '{right}'? (known: "
        f"{', '.join(registry.names())}); a plugin's class is registered once its file is "
        "loaded with --plugin-dir, or it is named by its dotted path (module.Class)"
    )


@pytest.mark.parametrize("registry, base", REGISTRIES, ids=lambda r: getattr(r, "name", ""))
def test_every_registry_says_how_a_plugin_joins(registry, base):
    for name in ("openai_mat", "no_such_module.Thing"):
        with pytest.raises(KeyError) as info:
            registry.get(name)
        message = info.value.args[0]
        assert "did you mean" not in message  # nothing is close: the known names instead
        assert f"(known: {', '.join(registry.names())}); " in message
        assert message.endswith("--plugin-dir, or it is named by its dotted path (module.Class)")


def test_a_registry_without_base_names_no_dotted_paths_in_its_hint():
    reg: Registry = Registry("things")
    reg.register_module("alpha", DottedReward)
    with pytest.raises(KeyError) as info:
        reg.get("alpah")
    assert info.value.args[0] == (
        "things has no module named 'alpah'; did you mean 'alpha'? (known: alpha); a plugin's "
        "class is registered once its file is loaded with --plugin-dir"
    )
