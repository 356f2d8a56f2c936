"""Multi-turn episodes through a real engine: each turn continues the previous turn's tokens,
through ``model.chat`` and through the OpenAI client, so ``merge_turns`` makes one experience."""

import pytest

from tests.unit.test_openai_server import LocalServer, make_engine
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows.multiturn import merge_turns


@pytest.fixture(scope="module")
def local(micro_model):
    host = LocalServer(make_engine(micro_model), micro_model)
    yield host
    host.close()


def model(local) -> ModelWrapper:
    return ModelWrapper(local, {"max_tokens": 5, "min_tokens": 1}, enable_history=True)


def continues(history) -> bool:
    return all(
        now.tokens[: len(before.tokens)].tolist() == before.tokens.tolist()
        for before, now in zip(history, history[1:], strict=False)
    )


def _seed_with_a_special_token_inside(local, messages) -> int:
    """A seed whose first reply holds a special token before its end: its text drops it, so
    rendering the conversation from text would give other tokens than were sampled."""
    engine = local.model.engine
    special = set(engine.tokenizer.all_special_ids)
    probe = ModelWrapper(local, {"max_tokens": 5, "min_tokens": 5})
    for seed in range(200):
        (reply,) = probe.chat(messages, seed=seed)
        if special & set(reply.tokens[reply.prompt_length : -1].tolist()):
            return seed
    raise AssertionError("no seed of 200 sampled a special token inside a reply")


def test_three_turns_of_model_chat_are_one_token_exact_episode(local):
    wrapper = ModelWrapper(local, {"max_tokens": 5, "min_tokens": 5}, enable_history=True)
    messages = [{"role": "user", "content": "2+2="}]
    seed = _seed_with_a_special_token_inside(local, messages)
    for k in range(3):
        (reply,) = wrapper.chat(messages, seed=seed + k)
        messages += [
            {"role": "assistant", "content": reply.response_text},
            {"role": "user", "content": f"try {k}"},
        ]
    history = wrapper.extract_experience_from_history()
    assert len(history) == 3 and continues(history)
    # the text of the conversation, rendered again, is not what the model saw
    rendered = local.model.engine.apply_chat_template(messages[:3])
    assert rendered != history[1].tokens[: history[1].prompt_length].tolist()
    episode = merge_turns(history, reward=1.0)
    sampled = sum(len(h.tokens) - h.prompt_length for h in history)
    assert int(episode.action_mask.sum()) == sampled  # exactly the three replies are trained


def test_an_agent_on_the_openai_client_gets_the_same_continuation(local):
    wrapper = model(local)
    client = wrapper.get_openai_client()
    messages = [{"role": "user", "content": "3+4="}]
    for k in range(3):
        reply = client.chat.completions.create(
            model=client.model_path, messages=messages, max_tokens=5, seed=k
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"again {k}"},
        ]
    history = wrapper.extract_experience_from_history()
    assert len(history) == 3 and continues(history)
    merge_turns(history)


def test_episodes_of_one_wrapper_do_not_mix(local):
    """A new episode (a conversation that extends no recorded turn) starts from its render."""
    wrapper = model(local)
    first = [{"role": "user", "content": "1+1="}]
    (reply,) = wrapper.chat(first, seed=1)
    second = [{"role": "user", "content": "5+5="}]
    (other,) = wrapper.chat(second, seed=2)
    assert other.tokens[: other.prompt_length].tolist() == local.model.engine.apply_chat_template(
        second
    )
    assert reply.tokens[: reply.prompt_length].tolist() == local.model.engine.apply_chat_template(
        first
    )


def test_prompt_length_counts_the_prompt_the_next_chat_samples_from(local):
    """Counted as ``chat`` builds it (continued from the sampled tokens), nothing recorded."""
    import asyncio

    wrapper = model(local)
    messages = [{"role": "user", "content": "6+1="}]
    assert wrapper.prompt_length(messages) == len(local.model.engine.apply_chat_template(messages))
    (reply,) = wrapper.chat(messages, seed=3)
    messages += [
        {"role": "assistant", "content": reply.response_text},
        {"role": "user", "content": "and 6+2="},
    ]
    counted = wrapper.prompt_length(messages)
    assert asyncio.run(wrapper.prompt_length_async(messages)) == counted
    assert len(wrapper.extract_experience_from_history()) == 1  # the count is not a call
    (next_reply,) = wrapper.chat(messages, seed=4)
    assert next_reply.prompt_length == counted
