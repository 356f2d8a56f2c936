"""A real pretrained model through the project: SmolLM2-135M-Instruct (BPE tokenizer of 49,152
tokens, ChatML template with a default system turn, <|im_end|> as its end of turn).

Its folder is imported from the GGUF file of the ``smollm2`` extra once per session
(``smollm2_model`` in tests/conftest.py). The multi-turn tests drive the OpenAI-compatible
server over HTTP, as an agent would.
"""

import json
import os

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.unit.test_openai_server import LocalServer
from trinity.common.models.model import ModelWrapper
from trinity.engine.transformers_model import TransformersInferenceModel
from trinity.explorer.multiturn import merge_turns
from trinity.runtime.launcher import run

HERE = os.path.dirname(__file__)

# Qwen3-style: every generation prompt opens an empty think block, and earlier assistant turns
# are re-rendered with their think blocks stripped, so a re-render is not what was sampled.
THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' %}{{ (m.content or '').split('</think>')[-1].lstrip() }}"
    "{%- else %}{{ m.content or '' }}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)


def engine(path: str, **kwargs) -> TransformersInferenceModel:
    return TransformersInferenceModel(
        model_path=path, max_model_len=512, max_prompt_tokens=None, max_response_tokens=12, **kwargs
    )


@pytest.fixture(scope="module")
def smollm2_server(smollm2_model):
    host = LocalServer(engine(smollm2_model), smollm2_model)
    yield host
    host.close()


def continues(history) -> bool:
    return all(
        now.tokens[: len(before.tokens)].tolist() == before.tokens.tolist()
        for before, now in zip(history, history[1:], strict=False)
    )


def test_the_imported_folder_loads_unchanged(smollm2_model):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    model = AutoModelForCausalLM.from_pretrained(smollm2_model)
    assert (len(tokenizer), model.config.vocab_size, model.config.num_hidden_layers) == (
        49152,
        49152,
        30,
    )
    assert model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # the end of a turn, the stop and padding ids come from the folder, not assumed
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    served = engine(smollm2_model).engine
    assert end in served.eos_ids and served.pad_id == tokenizer.pad_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def assert_three_turns_are_one_exact_episode(host, tokenizer) -> None:
    """Three greedy turns through ``host``'s OpenAI API, each sending the whole conversation
    as text: the history is one episode of the exact tokens sampled."""
    wrapper = ModelWrapper(host, {"max_tokens": 16}, enable_history=True)
    client = wrapper.get_openai_client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for question in ("And of Italy?", "And of Spain?", None):
        reply = client.chat.completions.create(  # greedy: "The capital of France is Paris."
            model=client.model_path, messages=messages, max_tokens=16, temperature=0.0
        )
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": question}] if question else []
    history = wrapper.extract_experience_from_history()
    assert len(history) == 3 and continues(history)
    episode = merge_turns(history, reward=1.0)
    sampled = sum(len(h.tokens) - h.prompt_length for h in history)
    assert int(episode.action_mask.sum()) == sampled
    # a reply that stopped on <|im_end|> keeps it: the token it sampled to end its turn
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stopped = [h for h in history if h.info["finish_reason"] == "stop"]
    assert stopped and all(h.tokens[-1].item() == end for h in stopped)


def test_three_turns_through_the_openai_client_are_one_exact_episode(smollm2_server):
    assert_three_turns_are_one_exact_episode(smollm2_server, smollm2_server.model.tokenizer)


def test_a_thinking_template_continues_from_the_sampled_tokens(smollm2_model):
    """The template re-renders earlier replies without their think block; the server still
    continues each turn from the exact tokens sampled, think block included."""
    host = LocalServer(engine(smollm2_model, chat_template=THINKING_TEMPLATE), smollm2_model)
    try:
        wrapper = ModelWrapper(host, {"max_tokens": 12}, enable_history=True)
        client = wrapper.get_openai_client()
        messages = [{"role": "user", "content": "Name a color."}]
        for k in range(2):
            reply = client.chat.completions.create(
                model=client.model_path, messages=messages, max_tokens=12, seed=k
            )
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "Another one."},
            ]
        first, second = wrapper.extract_experience_from_history()
        assert continues([first, second])
        think = host.model.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
        prompt = first.tokens[: first.prompt_length].tolist()
        assert prompt[-len(think) :] == think  # the first turn was sampled after the block
        rendered = host.model.engine.apply_chat_template(messages[:3])
        assert rendered != second.tokens[: second.prompt_length].tolist()  # a re-render differs
    finally:
        host.close()


def test_tools_reach_a_template_without_a_tools_section(smollm2_server):
    """SmolLM2's template ignores ``tools``: they go into the system turn in the Hermes format
    the server parses calls from, and a call the model made is written back as that text."""
    calc = {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
    engine_ = smollm2_server.model.engine
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "calc", "arguments": '{"expression": "37*48"}'},
    }
    messages = [
        {"role": "user", "content": "What is 37 * 48?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "1776"},
    ]
    text = engine_.render_chat(messages, [calc])
    assert text.startswith("<|im_start|>system\nYou can call functions")
    assert json.dumps(calc) in text
    assert '<tool_call>{"name": "calc", "arguments": {"expression": "37*48"}}</tool_call>' in text
    assert text.endswith("<|im_start|>tool\n1776<|im_end|>\n<|im_start|>assistant\n")


GRPO_SMALL = os.path.join(HERE, "configs", "grpo_small.yaml")


def two_grpo_steps(tmp_path, smollm2_model, overrides: list) -> tuple:
    """Two GRPO steps on SmolLM2 with ``overrides``: the job folder and the trainer's metrics."""
    (result,) = run(GRPO_SMALL, two_grpo_steps_overrides(tmp_path, smollm2_model, overrides), [])
    return result.job_dir, trainer_records(result.job_dir)


def trainer_records(job_dir: str) -> list:
    with open(os.path.join(job_dir, "monitor", "trainer.jsonl")) as f:
        return [json.loads(line) for line in f]


def two_grpo_steps_overrides(tmp_path, smollm2_model, overrides: list) -> list:
    """The command-line overrides of ``two_grpo_steps``."""
    from trinity.demo.word_problems import make_word_problems

    data = make_word_problems(str(tmp_path / "data"), n_train=8, n_test=4, n_sft=1)
    return [
        f"checkpoint_root_dir={tmp_path}",
        f"model.model_path={smollm2_model}",
        "model.max_prompt_tokens=96",
        "model.max_response_tokens=12",
        "algorithm.repeat_times=4",
        "buffer.batch_size=2",
        "buffer.total_steps=2",
        "buffer.explorer_input.default_reward_fn_type=math_verify_reward",
        f"buffer.explorer_input.taskset.path={data['rl_path']}",
        f"buffer.explorer_input.eval_tasksets.0.path={data['rl_path']}",
        "explorer.eval_on_startup=false",
        "explorer.eval_interval=100",
        "trainer.save_interval=0",
        "trainer.save_hf_checkpoint=never",
        *overrides,
    ]


@pytest.mark.slow
def test_two_grpo_steps_on_the_real_model_score_what_the_engine_sampled(tmp_path, smollm2_model):
    """Engine and trainer compute the same logprobs of the same tokens (fp32 on both sides):
    the PPO ratio at step 1 is 1 to within float rounding."""
    records = two_grpo_steps(tmp_path, smollm2_model, [])[1]
    assert [r["step"] for r in records] == [1, 2]
    assert abs(records[0]["actor/ppo_kl"]) < 1e-4
