"""``reasoning_parser``: how a reply splits into ``reasoning_content`` and ``content``, seen
through the ``openai`` client, for every case where vLLM's parsers of the same names decide
differently from a naive "<think> ... </think>" split. The expected pairs are what vLLM's
``deepseek_r1`` and ``qwen3`` parsers return for the same text, whitespace stripped; where
vLLM is installed, the last test asks it directly."""

from typing import Any, Optional, Tuple

import pytest

from tests.unit.test_openai_server import ADD_TOOL, ScriptedModel, _chat, served_by
from trinity.common.config.base import ConfigError, validate_model
from trinity.engine.reasoning import REASONING_PARSERS, split_reasoning

CALL = '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
# (reply text, parser, enable_thinking) -> (reasoning_content, content)
CASES = [
    # the case: a Qwen3 reply cut off while thinking is reasoning, not an answer
    ("<think>still pondering the question", "qwen3", True, "still pondering the question", None),
    (
        "<think>still pondering the question",
        "deepseek_r1",
        True,
        "still pondering the question",
        None,
    ),
    # no tags at all: both parsers start in reasoning
    ("just 3", "qwen3", True, "just 3", None),
    ("just 3", "deepseek_r1", True, "just 3", None),
    # the template opened the block in the prompt: the reply has only the closing tag
    ("steps</think>answer", "qwen3", True, "steps", "answer"),
    ("steps</think>answer", "deepseek_r1", True, "steps", "answer"),
    ("<think>\n\n</think>\n\n3", "qwen3", True, None, "3"),
    # text before <think>: deepseek_r1 drops it, qwen3 keeps it as reasoning
    ("so<think>steps</think>answer", "deepseek_r1", True, "steps", "answer"),
    ("so<think>steps</think>answer", "qwen3", True, "sosteps", "answer"),
    # a tool call ends Qwen3's reasoning; deepseek_r1 waits for </think>
    (f"let me add{CALL}", "qwen3", True, "let me add", CALL),
    (f"let me add{CALL}", "deepseek_r1", True, f"let me add{CALL}", None),
    # a second </think>: qwen3 drops it from the answer, deepseek_r1 keeps it
    ("a</think>b</think>c", "qwen3", True, "a", "bc"),
    ("a</think>b</think>c", "deepseek_r1", True, "a", "b</think>c"),
    # enable_thinking false: Qwen3's template closed an empty block in the prompt
    ("<think>still pondering", "qwen3", False, None, "<think>still pondering"),
    ("steps</think>answer", "qwen3", False, None, "steps</think>answer"),
    ("just 3", "deepseek_r1", False, "just 3", None),  # deepseek_r1 has no such switch
]


def _reply(text: str, parser: str, thinking: bool) -> Tuple[Optional[str], Optional[str]]:
    """(reasoning_content, content) of the openai client's message for ``text``."""
    scripted = served_by(ScriptedModel(text), reasoning_parser=parser, enable_thinking=thinking)
    try:
        message = _chat(scripted.client()).choices[0].message
    finally:
        scripted.close()
    # the openai package keeps fields it does not declare in model_extra
    return message.model_extra["reasoning_content"], message.content


@pytest.mark.parametrize("text, parser, thinking, reasoning, content", CASES)
def test_the_openai_client_sees_vllms_split(text, parser, thinking, reasoning, content):
    assert _reply(text, parser, thinking) == (reasoning, content)


def test_tool_calls_after_qwen3_reasoning_reach_the_client():
    scripted = served_by(
        ScriptedModel(f"<think>add them{CALL}"),
        reasoning_parser="qwen3",
        enable_thinking=True,
        enable_auto_tool_choice=True,
    )
    try:
        message = _chat(scripted.client(), tools=[ADD_TOOL]).choices[0].message
    finally:
        scripted.close()
    assert message.model_extra["reasoning_content"] == "add them"
    assert message.content is None and message.tool_calls[0].function.name == "add"


def test_the_config_offers_exactly_the_parsers_there_are():
    from typing import get_args

    from trinity.common.config.schema_explorer import InferenceModelConfig

    annotation = InferenceModelConfig.model_fields["reasoning_parser"].annotation
    assert set(get_args(get_args(annotation)[0])) == set(REASONING_PARSERS)
    with pytest.raises(ConfigError, match="did you mean 'qwen3'"):
        validate_model(InferenceModelConfig, {"reasoning_parser": "qwen"})


def _vllm_split(parser: str, thinking: bool, text: str, tokenizer: Any) -> Tuple[Any, Any]:
    from vllm.reasoning import ReasoningParserManager

    kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
    reasoning, content = ReasoningParserManager.get_reasoning_parser(parser)(
        tokenizer, **kwargs
    ).extract_reasoning(text, None)
    return (reasoning or "").strip() or None, (content or "").strip() or None


def test_vllms_own_parsers_agree_where_vllm_is_installed(micro_model):
    pytest.importorskip("vllm.reasoning", reason="vLLM is not installed (the vllm extra)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(micro_model)
    tokenizer.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])
    for text, parser, thinking, reasoning, content in CASES:
        expected = (reasoning, content)
        assert _vllm_split(parser, thinking, text, tokenizer) == expected, (text, parser)
        assert split_reasoning(text, parser, thinking) == expected
