"""guess_number_workflow against a stand-in model wrapper that records its calls (history).

The stand-in builds each turn's prompt with ``Conversation`` (token-exact continuation, as the
wrapper does with ``enable_history``) and samples replies from a scripted policy.
"""

import asyncio
import re
from typing import Callable, List

import pytest

from trinity.common.config import GenerationConfig
from trinity.common.experience import Experience
from trinity.common.workflows import Task
from trinity.demo.tiny import IM_END, build_char_tokenizer
from trinity.engine.conversation import Conversation

TOKENIZER = build_char_tokenizer()
END_ID = TOKENIZER.convert_tokens_to_ids(IM_END)


def interval(messages) -> tuple:
    low, high = re.search(r"(\d+)-(\d+)$", messages[-1]["content"]).groups()
    return int(low), int(high)


def halving(messages) -> str:
    low, high = interval(messages)
    return str((low + high) // 2)


def lowest(messages) -> str:
    return str(interval(messages)[0])


class RecordingModel:
    """What a workflow sees of ``ModelWrapper`` with ``enable_history: true``."""

    def __init__(self, policy: Callable[[list], str], foreign_calls: int = 0) -> None:
        self.policy = policy
        self.foreign_calls = foreign_calls  # calls of other tasks recorded with each one
        self.conversation = Conversation(
            lambda m, tools, gen: TOKENIZER.apply_chat_template(
                m, add_generation_prompt=gen, tokenize=False
            ),
            lambda text: TOKENIZER.encode(text, add_special_tokens=False),
            lambda ids: TOKENIZER.decode(ids, skip_special_tokens=False),
            {END_ID},
        )
        self.history: List[Experience] = []
        self.sampling: List[dict] = []

    def chat(self, messages, tools=None, **kwargs) -> List[Experience]:
        self.sampling.append(kwargs)
        prompt = self.conversation.prompt_ids(messages)
        text = self.policy(messages)
        sampled = TOKENIZER.encode(text, add_special_tokens=False) + [END_ID]
        reply = {"role": "assistant", "content": text}
        self.conversation.record(messages, None, prompt, [(reply, sampled)])
        exp = Experience(
            tokens=prompt + sampled,
            prompt_length=len(prompt),
            logprobs=[-0.25] * len(sampled),
            response_text=text,
        )
        self.history += [exp] + [exp] * self.foreign_calls
        return [exp]

    async def chat_async(self, messages, tools=None, **kwargs) -> List[Experience]:
        return self.chat(messages, tools, **kwargs)

    def extract_experience_from_history(self) -> List[Experience]:
        taken, self.history = self.history, []
        return taken


def task(low=0, high=14, secret=9, max_turns=4, n=3, **row) -> Task:
    raw = {"low": low, "high": high, "secret": secret, "max_turns": max_turns, **row}
    return Task(
        workflow="guess_number_workflow",
        raw_task=raw,
        rollout_args=GenerationConfig(n=n, temperature=0.7, max_tokens=4),
        taskset_name="games",
        index=5,
    )


def decode(ids) -> str:
    return TOKENIZER.decode(list(ids), skip_special_tokens=False)


def test_each_episode_is_one_experience_trained_on_the_guesses_only():
    model = RecordingModel(halving)
    exps = task().to_workflow(model).run()
    assert len(exps) == 3 and len(model.sampling) == 9  # 3 episodes of 3 turns
    assert all(
        s["n"] == 1 and s["temperature"] == 0.7 and s["max_tokens"] == 4 for s in model.sampling
    )
    dialogue = [
        {"role": "user", "content": "guess 0-14"},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "higher 8-14"},
        {"role": "assistant", "content": "11"},
        {"role": "user", "content": "lower 8-10"},
        {"role": "assistant", "content": "9"},
    ]
    whole = TOKENIZER.apply_chat_template(dialogue, tokenize=False).removesuffix("\n")
    opening = TOKENIZER.apply_chat_template(
        dialogue[:1], add_generation_prompt=True, tokenize=False
    )
    for exp in exps:
        assert decode(exp.tokens) == whole  # the dialogue, ending with the last guess
        assert decode(exp.tokens[: exp.prompt_length]) == opening
        response = exp.tokens[exp.prompt_length :].tolist()
        mask = exp.action_mask.tolist()
        trained = [t for t, m in zip(response, mask, strict=True) if m]
        context = [t for t, m in zip(response, mask, strict=True) if not m]
        assert decode(trained) == f"7{IM_END}11{IM_END}9{IM_END}"
        assert "higher 8-14" in decode(context) and "lower 8-10" in decode(context)
        assert exp.logprobs.tolist() == [-0.25 if m else 0.0 for m in mask]
        assert exp.reward == 1.0 and exp.metrics == {"accuracy": 1.0, "turns": 3.0}
        assert exp.info["turns"] == 3 and exp.info["success"] is True
    assert model.history == []  # every recorded call was taken


def test_each_turn_records_the_state_it_answered_and_where_its_reply_starts():
    model = RecordingModel(halving)
    (exp,) = task(n=1).to_workflow(model).run()
    # 0-14 with 4 guesses -> "7" -> higher 8-14, 3 left -> "11" -> lower 8-10, 2 left -> "9"
    assert exp.turn_states == ["0-14 with 4 left", "8-14 with 3 left", "8-10 with 2 left"]
    response = exp.tokens[exp.prompt_length :].tolist()
    replies = [decode(response[a : a + 2]) for a in exp.turn_starts[:2]]
    assert exp.turn_starts[0] == 0 and replies == [f"7{IM_END}", "11"]
    assert decode(response[exp.turn_starts[2] :]) == f"9{IM_END}"
    assert type(task().to_workflow(model)).records_turn_states


def test_a_game_not_won_in_max_turns_scores_zero_and_its_last_answer_is_never_sent():
    model = RecordingModel(lowest)
    (exp,) = task(low=0, high=6, secret=6, max_turns=3, n=1).to_workflow(model).run()
    assert exp.reward == 0.0 and exp.metrics == {"accuracy": 0.0, "turns": 3.0}
    text = decode(exp.tokens)
    assert text.endswith(f"assistant\n2{IM_END}") and "higher 3-6" not in text
    assert "higher 1-6" in text and "higher 2-6" in text


def test_an_invalid_reply_ends_the_episode_lost_after_one_turn():
    model = RecordingModel(lambda messages: "pass")
    exps = task(n=2).to_workflow(model).run()
    assert [e.metrics for e in exps] == [{"accuracy": 0.0, "turns": 1.0}] * 2
    assert all(e.action_mask.all() for e in exps)  # one reply: all of the response is sampled


def test_run_async_plays_the_same_episodes():
    blocking = task().to_workflow(RecordingModel(halving)).run()
    concurrent = asyncio.run(task().to_workflow(RecordingModel(halving)).run_async())
    for a, b in zip(blocking, concurrent, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.reward == b.reward
        assert a.action_mask.tolist() == b.action_mask.tolist()


def test_calls_left_from_a_failed_attempt_are_dropped():
    model = RecordingModel(halving)
    model.history = [Experience(tokens=[1, 2, 3], prompt_length=1)]
    exps = task(n=1).to_workflow(model).run()
    assert exps[0].metrics["turns"] == 3.0 and exps[0].prompt_length > 1


def test_a_history_shared_with_other_tasks_is_an_error_not_a_mixed_episode():
    with pytest.raises(RuntimeError, match="holds 6 call.* episode of 3 turn.*per task"):
        task(n=1).to_workflow(RecordingModel(halving, foreign_calls=1)).run()


def test_a_bad_row_names_the_taskset_and_row():
    bad = task()
    del bad.raw_task["secret"]
    with pytest.raises(ValueError, match="taskset 'games' row 5: .*missing secret"):
        bad.to_workflow(RecordingModel(halving))


def test_reset_points_the_workflow_at_another_game():
    model = RecordingModel(halving)
    workflow = task().to_workflow(model)
    assert workflow.resettable()
    workflow.reset(task(low=3, high=9, secret=4, max_turns=3, n=1))
    (exp,) = workflow.run()
    assert decode(exp.tokens).count("guess 3-9") == 1 and exp.metrics["turns"] == 2.0
