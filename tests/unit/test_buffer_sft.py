"""SFT formatting with a hand-checkable char tokenizer, and the SFT reader."""

import json
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trinity.buffer import PromptTooLongError, SFTFormatter, SFTReader

# ids: <pad>=0 <|im_start|>=1 <|im_end|>=2 "\n"=3 " "=4 a..z=5..30 0..9=31..40 "+"=41 "="=42
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHARS = ["\n", " "] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789+=")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
S, E, NL = 1, 2, 3  # <|im_start|>, <|im_end|> (= eos), newline
USER = [25, 23, 9, 22]  # u s e r
SYSTEM = [23, 29, 23, 24, 9, 17]  # s y s t e m
ASSISTANT = [5, 23, 23, 13, 23, 24, 5, 18, 24]  # a s s i s t a n t
ONE_PLUS_ONE, TWO_PLUS_TWO = [32, 41, 32], [33, 41, 33]  # "1+1", "2+2"
TWO, FOUR = 33, 35


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per char
    tok.decoder = decoders.Fuse()  # decode by concatenation, no spaces between chars
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", chat_template=CHATML
    )


def fmt(**overrides) -> SimpleNamespace:
    values = dict(
        prompt_type="plaintext",
        prompt_key="question",
        response_key="answer",
        system_prompt_key=None,
        system_prompt=None,
        messages_key="messages",
        tools_key="tools",
        enable_concatenated_multi_turn=False,
        chat_template=None,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def test_plaintext_worked_example(tokenizer):
    exp = SFTFormatter(tokenizer, fmt()).format({"question": "1+1", "answer": "2"})
    # "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n" then "2" + eos
    prompt = [S, *USER, NL, *ONE_PLUS_ONE, E, NL, S, *ASSISTANT, NL]
    assert exp.tokens.tolist() == prompt + [TWO, E]
    assert exp.prompt_length == len(prompt) == 22
    assert exp.action_mask.tolist() == [True, True]
    assert exp.response_text == "2<|im_end|>"


def test_system_prompt_from_row_wins_over_config(tokenizer):
    f = fmt(system_prompt_key="sys", system_prompt="bb")
    from_row = SFTFormatter(tokenizer, f).format({"question": "1+1", "answer": "2", "sys": "a"})
    from_cfg = SFTFormatter(tokenizer, f).format({"question": "1+1", "answer": "2", "sys": None})
    # "<|im_start|>system\n" + system text + "<|im_end|>\n" comes first
    assert from_row.tokens[:10].tolist() == [S, *SYSTEM, NL, 5, E]
    assert from_cfg.tokens[:11].tolist() == [S, *SYSTEM, NL, 6, 6, E]


def test_custom_chat_template_from_format(tokenizer):
    template = (
        "{% for m in messages %}{{ m['role'][0] }}={{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}a={% endif %}"
    )
    exp = SFTFormatter(tokenizer, fmt(chat_template=template)).format(
        {"question": "1+1", "answer": "2"}
    )
    # "u=1+1<|im_end|>a=" then "2<|im_end|>"
    assert exp.tokens.tolist() == [25, 42, *ONE_PLUS_ONE, E, 5, 42, TWO, E]
    assert exp.prompt_length == 8


CONVERSATION = [
    {"role": "user", "content": "1+1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2"},
    {"role": "assistant", "content": "4"},
]
TURN_1 = [S, *USER, NL, *ONE_PLUS_ONE, E, NL, S, *ASSISTANT, NL]  # up to the first answer
BETWEEN = [NL, S, *USER, NL, *TWO_PLUS_TWO, E, NL, S, *ASSISTANT, NL]  # after "2<|im_end|>"


def test_messages_train_only_the_last_assistant_turn(tokenizer):
    exp = SFTFormatter(tokenizer, fmt(prompt_type="messages")).format({"messages": CONVERSATION})
    assert exp.tokens.tolist() == TURN_1 + [TWO, E] + BETWEEN + [FOUR, E]
    assert exp.prompt_length == 22 + 2 + 23
    assert exp.action_mask.tolist() == [True, True]


def test_concatenated_multi_turn_masks_every_assistant_turn(tokenizer):
    f = fmt(prompt_type="messages", enable_concatenated_multi_turn=True)
    exp = SFTFormatter(tokenizer, f).format({"messages": CONVERSATION})
    assert exp.tokens.tolist() == TURN_1 + [TWO, E] + BETWEEN + [FOUR, E]
    assert exp.prompt_length == 22  # the prompt ends before the first assistant turn
    assert exp.action_mask.int().tolist() == [1, 1] + [0] * len(BETWEEN) + [1, 1]


def test_truncation_drops_from_the_response_end(tokenizer):
    f = fmt(prompt_type="messages", enable_concatenated_multi_turn=True)
    exp = SFTFormatter(tokenizer, f, max_model_len=25).format({"messages": CONVERSATION})
    # 22 prompt tokens + the first 3 response tokens: "2", eos, "\n"
    assert exp.tokens.tolist() == TURN_1 + [TWO, E, NL]
    assert exp.action_mask.int().tolist() == [1, 1, 0]
    assert exp.info["truncated"]
    with pytest.raises(PromptTooLongError):
        SFTFormatter(tokenizer, f, max_model_len=22).format({"messages": CONVERSATION})


def test_template_that_rewrites_answers_is_refused(tokenizer):
    template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}x{% endif %}"
        "{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    with pytest.raises(ValueError, match="does not render assistant turns"):
        SFTFormatter(tokenizer, fmt(chat_template=template)).format(
            {"question": "1+1", "answer": "2"}
        )


def test_conversation_without_assistant_turn_is_refused(tokenizer):
    with pytest.raises(ValueError, match="no assistant turn"):
        SFTFormatter(tokenizer, fmt(prompt_type="messages")).format({"messages": CONVERSATION[:1]})


def sft_storage(path, **format_overrides) -> SimpleNamespace:
    return SimpleNamespace(
        name="sft",
        storage_type="file",
        path=str(path),
        subset_name=None,
        split="train",
        format=fmt(**format_overrides),
        task_selector=None,
    )


def test_reader_batches_drop_too_long_rows_and_resume(tmp_path, tokenizer):
    rows = [{"question": "1+1", "answer": str(i)} for i in range(5)]
    rows[1]["question"] = "1+1" * 4  # prompt of 31 tokens: longer than max_model_len
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reader = SFTReader(sft_storage(tmp_path), tokenizer, batch_size=2, max_model_len=24)
    first = reader.read()
    # row 1 is skipped and the batch refilled with row 2: answers "0" and "2"
    assert [e.tokens[22].item() for e in first] == [31, 33]
    assert reader.num_dropped == 1
    state = reader.state_dict()
    resumed = SFTReader(sft_storage(tmp_path), tokenizer, batch_size=2, max_model_len=24)
    resumed.load_state_dict(state)
    assert [e.tokens[22].item() for e in resumed.read()] == [34, 35]  # answers "3", "4"
    with pytest.raises(StopIteration):
        resumed.read()


def test_reader_requires_format_columns(tmp_path, tokenizer):
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "1", "response": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"\['question', 'answer'\].*missing"):
        SFTReader(sft_storage(tmp_path), tokenizer, batch_size=1)


def test_tool_calls_are_trained_and_tool_results_are_not():
    from trinity.demo.calculator import CALC_TOOL, tool_dialogue
    from trinity.demo.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    row = {"messages": tool_dialogue("12*11", "132"), "tools": [CALC_TOOL]}
    f = fmt(prompt_type="messages", tools_key="tools", enable_concatenated_multi_turn=True)
    exp = SFTFormatter(tokenizer, f).format(row)
    response = exp.tokens[exp.prompt_length :].tolist()
    trained = [t for t, m in zip(response, exp.action_mask.tolist(), strict=True) if m]
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "12*11"}}</tool_call>'
    # Written by hand: the call's turn and the answer's turn, each closed by <|im_end|>.
    assert tokenizer.decode(trained) == f"{call}<|im_end|>132<|im_end|>"
    assert tokenizer.decode(exp.tokens[: exp.prompt_length].tolist()) == (
        "<|im_start|>system\n<tools>calc(expression)</tools><|im_end|>\n"
        "<|im_start|>user\n12*11<|im_end|>\n<|im_start|>assistant\n"
    )
    context = [t for t, m in zip(response, exp.action_mask.tolist(), strict=True) if not m]
    assert tokenizer.decode(context) == (
        "\n<|im_start|>tool\n132<|im_end|>\n<|im_start|>assistant\n"
    )
