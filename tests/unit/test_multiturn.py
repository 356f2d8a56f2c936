"""Token-exact multi-turn prompts (Conversation) and one experience per episode (merge_turns)."""

import pytest
import torch

from trinity.common.experience import Experience
from trinity.common.workflows.multiturn import EpisodeBreak, merge_turns
from trinity.demo.tiny import IM_END, IM_START, build_char_tokenizer
from trinity.engine.conversation import Conversation


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def conversation(tokenizer) -> Conversation:
    def render(messages, tools, add_generation_prompt):
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    end_ids = {tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id}
    return Conversation(
        render,
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
        end_ids,
    )


def ids(tokenizer, text: str) -> list:
    return tokenizer.encode(text, add_special_tokens=False)


def sampled_reply(tokenizer, text: str, special_inside: bool) -> list:
    """What the model 'sampled': the text, a stray special token inside, then end-of-turn."""
    start = tokenizer.convert_tokens_to_ids(IM_START)
    middle = [start] if special_inside else []
    half = len(text) // 2
    return (
        ids(tokenizer, text[:half])
        + middle
        + ids(tokenizer, text[half:])
        + [tokenizer.convert_tokens_to_ids(IM_END)]
    )


def play(tokenizer, turns: int, special_inside: bool = True):
    """A dialogue of ``turns`` calls; returns the recorded calls and the expected pieces."""
    conv = conversation(tokenizer)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    recorded, pieces = [], []
    for k in range(turns):
        prompt = conv.prompt_ids(messages)
        sampled = sampled_reply(tokenizer, f"answer {k}", special_inside)
        reply = {
            "role": "assistant",
            "content": tokenizer.decode(sampled, skip_special_tokens=True),
        }
        conv.record(messages, None, prompt, [(reply, sampled)])
        recorded.append(
            Experience(
                tokens=prompt + sampled,
                prompt_length=len(prompt),
                logprobs=[-0.5 - k] * len(sampled),
            )
        )
        pieces.append((prompt, sampled))
        messages = messages + [reply, {"role": "tool", "content": f"result {k}"}]
    return recorded, pieces


def test_next_prompt_continues_the_sampled_tokens_not_their_text(tokenizer):
    _, ((p1, s1), (p2, _)) = play(tokenizer, 2)
    assert p2[: len(p1) + len(s1)] == p1 + s1  # the stray special token kept, as sampled
    assert tokenizer.decode(p2[len(p1) + len(s1) :]) == (
        f"\n{IM_START}tool\nresult 0{IM_END}\n{IM_START}assistant\n"
    )
    # Rendering the conversation from text would have lost it: the reply text has no special
    # token, so re-tokenizing it gives other tokens than the model produced.
    rendered = conversation(tokenizer).prompt_ids(
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": tokenizer.decode(s1, skip_special_tokens=True)},
            {"role": "tool", "content": "result 0"},
        ]
    )
    assert rendered[: len(p1) + len(s1)] != p1 + s1


def test_three_turn_episode_is_one_experience_trained_on_exactly_the_sampled_spans(tokenizer):
    recorded, pieces = play(tokenizer, 3)
    exp = merge_turns(recorded, reward=1.0)
    (p1, s1), (p2, s2), (p3, s3) = pieces
    d1 = p2[len(p1) + len(s1) :]
    d2 = p3[len(p2) + len(s2) :]
    assert exp.tokens.tolist() == p1 + s1 + d1 + s2 + d2 + s3
    assert exp.prompt_length == len(p1) and exp.reward == 1.0 and exp.info["turns"] == 3
    expected_mask = [1] * len(s1) + [0] * len(d1) + [1] * len(s2) + [0] * len(d2) + [1] * len(s3)
    assert exp.action_mask.int().tolist() == expected_mask
    expected_lp = [-0.5] * len(s1) + [0.0] * len(d1) + [-1.5] * len(s2) + [0.0] * len(d2)
    assert exp.logprobs.tolist() == expected_lp + [-2.5] * len(s3)
    # each reply's offset into the response; no states unless the workflow gives them
    assert exp.turn_starts == [0, len(s1) + len(d1), len(s1) + len(d1) + len(s2) + len(d2)]
    assert exp.turn_states is None
    with_states = merge_turns(recorded, reward=1.0, states=["a", "b", "a"])
    assert with_states.turn_states == ["a", "b", "a"]
    with pytest.raises(ValueError, match="2 states for 3 calls"):
        merge_turns(recorded, states=["a", "b"])


def test_a_reply_cut_by_length_is_closed_by_the_template(tokenizer):
    conv = conversation(tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    prompt = conv.prompt_ids(messages)
    sampled = ids(tokenizer, "hel")  # no end-of-turn token: max_tokens reached
    reply = {"role": "assistant", "content": "hel"}
    conv.record(messages, None, prompt, [(reply, sampled)])
    nxt = conv.prompt_ids(messages + [reply, {"role": "user", "content": "go on"}])
    assert nxt[: len(prompt) + 3] == prompt + sampled
    assert tokenizer.decode(nxt[len(prompt) + 3 :]).startswith(f"{IM_END}\n{IM_START}user")


def test_another_conversation_is_rendered_from_scratch(tokenizer):
    conv = conversation(tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    prompt = conv.prompt_ids(messages)
    conv.record(
        messages, None, prompt, [({"role": "assistant", "content": "yo"}, ids(tokenizer, "yo"))]
    )
    other = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "edited"}]
    other.append({"role": "user", "content": "?"})
    assert conv.prompt_ids(other) == ids(
        tokenizer, tokenizer.apply_chat_template(other, add_generation_prompt=True, tokenize=False)
    )


def test_tool_call_replies_match_by_name_and_arguments(tokenizer):
    conv = conversation(tokenizer)
    messages = [{"role": "user", "content": "add"}]
    prompt = conv.prompt_ids(messages)
    sampled = ids(tokenizer, '<tool_call>{"name": "add"}</tool_call>')
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    returned = {"role": "assistant", "content": None, "tool_calls": [call]}
    conv.record(messages, None, prompt, [(returned, sampled)])
    resent = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
        ],
    }
    nxt = conv.prompt_ids(messages + [resent, {"role": "tool", "content": "2"}])
    assert nxt[: len(prompt) + len(sampled)] == prompt + sampled


def test_merge_names_the_turn_that_breaks_the_episode(tokenizer):
    recorded, _ = play(tokenizer, 3)
    broken = Experience(tokens=[1, 2, 3, 4], prompt_length=3)
    with pytest.raises(EpisodeBreak, match="turn 3's prompt does not continue turn 2's"):
        merge_turns([recorded[0], recorded[1], broken])
    with pytest.raises(ValueError, match="at least one"):
        merge_turns([])
    single = merge_turns(recorded[:1])
    assert torch.equal(single.tokens, recorded[0].tokens) and bool(single.action_mask.all())


def test_merge_turns_keeps_its_earlier_public_path():
    from trinity.explorer import multiturn

    assert multiturn.merge_turns is merge_turns and multiturn.EpisodeBreak is EpisodeBreak
