"""Data operators (``trinity/buffer/operators``): what each keeps, drops and changes."""

import pytest

from trinity.buffer.operators import (
    OPERATORS,
    Deduplicator,
    LengthFilter,
    RewardFilter,
    RewardShapingMapper,
    TaskContext,
)
from trinity.common.experience import Experience


def exp(group, response, reward=None, prompt=(1, 2), info=None, text=None, metrics=None):
    return Experience(
        tokens=list(prompt) + list(response),
        prompt_length=len(prompt),
        reward=reward,
        group_id=group,
        info=dict(info or {}),
        metrics=dict(metrics or {}),
        response_text=text,
    )


def responses(exps):
    return [(e.group_id, e.tokens[e.prompt_length :].tolist()) for e in exps]


def test_registry_names_the_builtins():
    assert OPERATORS.names() == [
        "data_juicer",
        "deduplicator",
        "length_filter",
        "reward_filter",
        "reward_shaping_mapper",
    ]


# ---- deduplicator ------------------------------------------------------------------------
def test_dedup_tasks_keeps_the_first_of_each_text_across_the_taskset():
    rows = [{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}, {"q": "1+1", "a": "x"}]
    kept, _ = Deduplicator().process_tasks(rows, TaskContext(["q"]))
    assert kept == rows[:2]


def test_dedup_tasks_on_several_fields_and_normalized():
    rows = [{"q": "Add  1", "a": "2"}, {"q": "add 1", "a": "2"}, {"q": "add 1", "a": "3"}]
    exact, _ = Deduplicator().process_tasks(rows, TaskContext(["q", "a"]))
    assert exact == rows
    loose, _ = Deduplicator(normalize_text=True).process_tasks(rows, TaskContext(["q", "a"]))
    assert loose == [rows[0], rows[2]]


def test_dedup_experiences_within_a_group_only():
    exps = [exp("g1", [5, 6]), exp("g1", [5, 6]), exp("g1", [5]), exp("g2", [5, 6])]
    kept, _ = Deduplicator().process_experiences(exps, whole_groups=True)
    # the repeat in g1 goes; the same response in another group (another task) stays
    assert responses(kept) == [("g1", [5, 6]), ("g1", [5]), ("g2", [5, 6])]


def test_a_missing_target_field_is_named():
    with pytest.raises(KeyError, match="target_fields: taskset 't' has no field 'x'"):
        Deduplicator().process_tasks([{"q": "1"}], TaskContext(["x"], taskset="t"))


# ---- length_filter -----------------------------------------------------------------------
def test_length_filter_tasks_in_characters_inclusive_bounds():
    rows = [{"q": "ab"}, {"q": "abc"}, {"q": "abcde"}, {"q": "abcdef"}]
    kept, _ = LengthFilter(3, 5, "characters").process_tasks(rows, TaskContext(["q"]))
    assert kept == rows[1:3]


def test_length_filter_tasks_in_tokens_of_the_model(micro_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(micro_model)
    rows = [{"q": "1+1="}, {"q": "12+34="}, {"q": "123+456="}]
    counts = [len(tok(r["q"], add_special_tokens=False)["input_ids"]) for r in rows]
    context = TaskContext(["q"], tokenizer_path=micro_model)
    kept, _ = LengthFilter(max_length=counts[1], unit="tokens").process_tasks(rows, context)
    assert kept == [r for r, n in zip(rows, counts, strict=True) if n <= counts[1]]
    assert len(kept) == 2  # the character-level tokenizer: one token per character


def test_length_filter_tasks_as_chat_prompts(micro_model):
    """ChatML on the character-level tokenizer: <|im_start|> user \\n TEXT <|im_end|> \\n
    <|im_start|> assistant \\n is 1 + 4 + 1 + len(TEXT) + 1 + 1 + 1 + 9 + 1 = 19 + len(TEXT)
    tokens (veRL's filter_overlong_prompts measures the prompt so)."""
    context = TaskContext(["q"], tokenizer_path=micro_model)
    rows = [{"q": "1+1="}, {"q": "12+34="}, {"q": "123+456="}]  # 23, 25, 27 tokens
    kept, _ = LengthFilter(max_length=25, chat_template=True).process_tasks(rows, context)
    assert kept == rows[:2]
    # a column of messages (veRL's prompt column) is templated as it is: two user turns
    chat = [{"role": "user", "content": "ab"}, {"role": "user", "content": "1+1="}]
    rows = [{"q": chat}, {"q": chat[1:]}]  # a turn is 8 + len: 10 + 12 + 11 = 33; 12 + 11
    kept, _ = LengthFilter(max_length=32, chat_template=True).process_tasks(rows, context)
    assert kept == rows[1:]
    kept, _ = LengthFilter(max_length=33, chat_template=True).process_tasks(rows, context)
    assert kept == rows


def test_length_filter_experiences_by_response_tokens_rows_or_groups():
    exps = [exp("g1", [5]), exp("g1", [5, 6, 7]), exp("g2", [5, 6]), exp("g2", [7, 7])]
    rows, _ = LengthFilter(max_length=2).process_experiences(exps, whole_groups=False)
    assert responses(rows) == [("g1", [5]), ("g2", [5, 6]), ("g2", [7, 7])]
    groups, _ = LengthFilter(max_length=2).process_experiences(exps, whole_groups=True)
    assert responses(groups) == [("g2", [5, 6]), ("g2", [7, 7])]  # g1 had one too long


def test_length_filter_experiences_in_characters_needs_the_text():
    kept, _ = LengthFilter(min_length=3, unit="characters").process_experiences(
        [exp("g", [5], text="ab"), exp("g", [5], text="abc")], whole_groups=False
    )
    assert [e.response_text for e in kept] == ["abc"]
    with pytest.raises(ValueError, match="needs Experience.response_text"):
        LengthFilter(min_length=1, unit="characters").process_experiences(
            [exp("g", [5])], whole_groups=False
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "set min_length, max_length or both"),
        ({"min_length": 5, "max_length": 2}, "minimum 5 is above the maximum 2"),
        ({"max_length": -1}, "max_length = -1: expected an integer >= 0"),
        ({"max_length": 3, "unit": "words"}, "unit = 'words'"),
        ({"max_length": 3, "unit": "characters", "chat_template": True}, "set unit: tokens"),
    ],
)
def test_length_filter_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LengthFilter(**kwargs)


# ---- reward_filter -----------------------------------------------------------------------
def test_reward_filter_rows_inclusive_and_without_reward_dropped():
    exps = [exp("a", [1], 0.0), exp("a", [2], 0.5), exp("b", [3], 1.0), exp("b", [4], None)]
    kept, metrics = RewardFilter(min_reward=0.5).process_experiences(exps, whole_groups=False)
    assert [e.reward for e in kept] == [0.5, 1.0]
    assert metrics == {"no_reward": 1.0}


def test_reward_filter_groups_by_their_mean_reward():
    # means: a = 0.5, b = 1.0, c = 0.0; max 0.99 and min 0.01 keep only the mixed group a
    exps = [exp(g, [i], r) for i, (g, r) in enumerate([("a", 0), ("a", 1), ("b", 1), ("b", 1)])]
    exps += [exp("c", [9], 0.0), exp("c", [8], 0.0)]
    f = RewardFilter(min_reward=0.01, max_reward=0.99)
    kept, _ = f.process_experiences(exps, whole_groups=True)
    assert [e.group_id for e in kept] == ["a", "a"]


def test_reward_filter_needs_a_bound():
    with pytest.raises(ValueError, match="set min_reward, max_reward or both"):
        RewardFilter()
    with pytest.raises(ValueError, match="minimum 1 is above the maximum 0"):
        RewardFilter(min_reward=1, max_reward=0)


# ---- reward_shaping_mapper ---------------------------------------------------------------
def test_reward_shaping_as_in_the_guide_adds_the_statistic():
    configs = [{"stats_key": "llm_quality_score", "op_type": "ADD", "weight": 1.0}]
    exps = [exp("g", [1], 1.0, info={"llm_quality_score": 0.25}), exp("g", [2], 0.0)]
    out, metrics = RewardShapingMapper(configs).process_experiences(exps, whole_groups=False)
    assert [e.reward for e in out] == [1.25, 0.0]  # the second has no score: unchanged
    assert metrics["missing_stats"] == 1.0
    assert metrics["reward_diff/max"] == 0.25 and metrics["reward_diff/min"] == 0.0
    assert metrics["reward_diff/mean"] == 0.125


@pytest.mark.parametrize(
    "op_type, weight, expected",
    [("ADD", 0.5, 3.0), ("SUB", 0.5, 1.0), ("MUL", 0.5, 2.0), ("DIV", 0.5, 2.0), ("div", 1, 1.0)],
)
def test_reward_shaping_operations(op_type, weight, expected):
    # reward 2, statistic 2: ADD 2 + 0.5*2, SUB 2 - 1, MUL 2 * 1, DIV 2 / 1, div 2 / 2
    mapper = RewardShapingMapper([{"stats_key": "s", "op_type": op_type, "weight": weight}])
    (out,), _ = mapper.process_experiences([exp("g", [1], 2.0, info={"s": 2})], False)
    assert out.reward == pytest.approx(expected)


def test_reward_shaping_in_order_defaults_and_reward_components():
    configs = [{"stats_key": "accuracy"}, {"stats_key": "len_penalty", "op_type": "MUL"}]
    e = exp("g", [1], 1.0, metrics={"accuracy": 1.0}, info={"len_penalty": 0.5})
    (out,), _ = RewardShapingMapper(configs).process_experiences([e], False)
    assert out.reward == pytest.approx((1.0 + 1.0) * 0.5)


def test_reward_shaping_divides_by_zero_never():
    mapper = RewardShapingMapper([{"stats_key": "s", "op_type": "DIV"}])
    (out,), _ = mapper.process_experiences([exp("g", [1], 3.0, info={"s": 0})], False)
    assert out.reward == 3.0


@pytest.mark.parametrize(
    "configs, message",
    [
        (None, "reward_shaping_configs is empty"),
        ([{"stats_key": "s", "op": "ADD"}], r"reward_shaping_configs\[0\].op: unknown key"),
        ([{"op_type": "ADD"}], r"\[0\].stats_key is missing"),
        ([{"stats_key": "s", "op_type": "POW"}], "op_type = POW: expected ADD, SUB, MUL, DIV"),
        ([{"stats_key": "s", "weight": "x"}], "weight = 'x': expected a number"),
    ],
)
def test_reward_shaping_configs_are_checked(configs, message):
    with pytest.raises(ValueError, match=message):
        RewardShapingMapper(configs)
