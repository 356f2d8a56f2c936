"""DPO pair data with a hand-checkable char tokenizer."""

import json
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from trinity.buffer.dpo import DPOReader, response_text

# ids: <pad>=0 <|im_start|>=1 <|im_end|>=2 "\n"=3 " "=4 a..z=5..30
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
CHARS = ["\n", " "] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
S, E, NL = 1, 2, 3
USER = [25, 23, 9, 22]  # u s e r
ASSISTANT = [5, 23, 23, 13, 23, 24, 5, 18, 24]  # a s s i s t a n t
HI = [12, 13]  # h i
OK, NO = [19, 15], [18, 19]  # o k, n o
# "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n": 1 + 4 + 1 + 2 + 1 + 1 + 1 + 9 + 1
PROMPT_HI = [S, *USER, NL, *HI, E, NL, S, *ASSISTANT, NL]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one token per char
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", chat_template=CHATML
    )


def storage(tmp_path, rows, **format_overrides) -> SimpleNamespace:
    path = tmp_path / f"dpo{len(list(tmp_path.iterdir()))}.jsonl"  # a new file per dataset
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = dict(
        prompt_type="plaintext",
        prompt_key="prompt",
        response_key="response",
        system_prompt_key=None,
        system_prompt=None,
        messages_key="messages",
        tools_key="tools",
        chosen_key="chosen",
        rejected_key="rejected",
        enable_concatenated_multi_turn=True,  # must not matter for DPO
        chat_template=None,
    )
    fmt.update(format_overrides)
    return SimpleNamespace(
        name="dpo",
        storage_type="file",
        path=str(path),
        subset_name=None,
        split="train",
        format=SimpleNamespace(**fmt),
        task_selector=None,
    )


def test_plaintext_pair_worked_example(tmp_path, tokenizer):
    reader = DPOReader(
        storage(tmp_path, [{"prompt": "hi", "chosen": "ok", "rejected": "no"}]), tokenizer, 1
    )
    chosen, rejected = reader.read(2)
    assert len(PROMPT_HI) == 21
    assert chosen.tokens.tolist() == PROMPT_HI + OK + [E]
    assert rejected.tokens.tolist() == PROMPT_HI + NO + [E]
    assert chosen.prompt_length == rejected.prompt_length == 21
    assert chosen.action_mask.tolist() == rejected.action_mask.tolist() == [True] * 3  # incl. eos
    assert chosen.info["is_chosen"] is True and rejected.info["is_chosen"] is False
    assert chosen.group_id == rejected.group_id == "0"
    assert chosen.response_text == "ok<|im_end|>"
    with pytest.raises(StopIteration):
        reader.read(2)


def test_messages_pair_accepts_strings_and_message_lists(tmp_path, tokenizer):
    row = {
        "messages": [{"role": "user", "content": "hi"}],
        "chosen": [{"role": "assistant", "content": "ok"}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    data = storage(tmp_path, [row], prompt_type="messages")
    chosen, rejected = DPOReader(data, tokenizer, 2).read()
    assert chosen.tokens.tolist() == PROMPT_HI + OK + [E]  # same as the plaintext row
    assert rejected.tokens.tolist() == PROMPT_HI + NO + [E]
    assert response_text("ok", "chosen", "messages") == "ok"
    with pytest.raises(ValueError, match="without an assistant turn"):
        response_text([{"role": "user", "content": "x"}], "chosen", "messages")
    with pytest.raises(ValueError, match="must be a string"):
        response_text([{"role": "assistant", "content": "x"}], "chosen", "plaintext")


def test_multi_turn_prompt_trains_only_the_compared_response(tmp_path, tokenizer):
    # the fixture turns enable_concatenated_multi_turn on: DPO ignores it, so the earlier
    # assistant turn "ok" is prompt, and only the final response (+ eos) is an action
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "hi"},
    ]
    row = {"messages": turns, "chosen": "no", "rejected": "ok"}
    chosen, rejected = DPOReader(
        storage(tmp_path, [row], prompt_type="messages"), tokenizer, 2
    ).read()
    prompt = PROMPT_HI + OK + [E, NL] + PROMPT_HI  # 21 + 2 + 2 + 21 = 46 tokens
    assert chosen.tokens.tolist() == prompt + NO + [E]
    assert rejected.tokens.tolist() == prompt + OK + [E]
    assert chosen.prompt_length == rejected.prompt_length == 46
    assert chosen.action_mask.tolist() == [True] * 3


def test_interleaved_pairs_refill_and_truncation(tmp_path, tokenizer):
    rows = [
        {"prompt": "hi", "chosen": "ok", "rejected": "no"},
        {"prompt": "hello there", "chosen": "ok", "rejected": "no"},  # prompt 30 tokens
        {"prompt": "hi", "chosen": "no", "rejected": "ok"},
    ]
    # max_model_len 22: row 1's prompt alone is too long (dropped, refilled with row 2); rows
    # 0 and 2 keep their 21 prompt tokens + the first response token only
    reader = DPOReader(storage(tmp_path, rows), tokenizer, 4, max_model_len=22)
    exps = reader.read()
    assert [e.group_id for e in exps] == ["0", "0", "2", "2"]
    assert [e.info["is_chosen"] for e in exps] == [True, False, True, False]
    assert [e.tokens[21:].tolist() for e in exps] == [[OK[0]], [NO[0]], [NO[0]], [OK[0]]]
    assert all(e.action_mask.tolist() == [True] and e.info["truncated"] for e in exps)
    assert reader.num_dropped == 1 and reader.num_truncated == 4


def test_state_dict_resumes_at_the_next_pair(tmp_path, tokenizer):
    rows = [{"prompt": "hi", "chosen": "ok", "rejected": c} for c in ("no", "on", "oo")]
    data = storage(tmp_path, rows)
    reader = DPOReader(data, tokenizer, 2, total_epochs=2)
    reader.read()
    state = reader.state_dict()
    resumed = DPOReader(data, tokenizer, 2, total_epochs=2)
    resumed.load_state_dict(state)
    assert [e.group_id for e in resumed.read(4)] == ["1", "1", "2", "2"]
    assert [e.group_id for e in resumed.read(4)] == ["0", "0", "1", "1"]  # second epoch
    assert resumed.num_steps() == 6  # 3 rows x 2 epochs, one pair per read


def test_missing_columns_and_bad_responses_are_reported(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="rejected"):
        DPOReader(storage(tmp_path, [{"prompt": "hi", "chosen": "ok"}]), tokenizer, 1)
    data = storage(tmp_path, [{"prompt": "hi", "chosen": "ok", "rejected": 3}])
    with pytest.raises(ValueError, match="line 1: 'rejected' must be a string, not a number"):
        DPOReader(data, tokenizer, 2)
