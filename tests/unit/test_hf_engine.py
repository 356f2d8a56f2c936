"""TransformersEngine: agrees with HF ``generate``, exact logprobs, limits, seeds, truncation."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.demo.tiny import TINY_PRESETS, build_tiny_model
from trinity.engine import sampling
from trinity.engine.hf_engine import SampleOutput, SamplingParams, TransformersEngine

QUESTIONS = ["1+2=", "What is 123 + 456? Think step by step.", "x", "0123456789 ~ 9876543210"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("engine") / "m"), **TINY_PRESETS["micro"])


def make_engine(model_dir, **kwargs):
    # One thread: the suite shares 2 cores with other processes, and OpenMP threads that
    # wait on a busy core make each step many times slower.
    args = dict(max_model_len=256, max_prompt_tokens=128, max_response_tokens=48, num_threads=1)
    return TransformersEngine(model_dir, **{**args, **kwargs})


@pytest.fixture(scope="module")
def engine(model_dir):
    return make_engine(model_dir)


def sharpened(engine):
    """Load random weights ~20x larger than the init: peaked, varied outputs whose greedy
    responses end at different steps (the fresh init answers every prompt alike)."""
    gen = torch.Generator().manual_seed(0)
    weights = engine.model.state_dict()
    engine.load_state_dict(
        {
            k: torch.randn(v.shape, generator=gen) * 20 / v.shape[-1] ** 0.5
            for k, v in weights.items()
            if v.dim() == 2
        }
    )
    return engine


@pytest.fixture(scope="module")
def sharp_engine(model_dir):
    return sharpened(make_engine(model_dir))


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]


def hf_greedy(engine, prompts, max_new_tokens, **kwargs):
    """Reference: plain ``model.generate`` on the left-padded batch, cut after eos."""
    batch = engine.tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    width = batch["input_ids"].shape[1]
    with torch.no_grad():
        out = engine.model.generate(
            **batch, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=1, **kwargs
        )
    results = []
    for row in out[:, width:].tolist():
        eos = [i for i, t in enumerate(row) if t in engine.eos_ids]
        results.append(row[: eos[0] + 1] if eos else row)
    return results


def recomputed_logprobs(engine, prompt, sample: SampleOutput, temperature):
    """log_softmax(logits / T) of the response tokens from one full forward pass."""
    ids = torch.tensor([prompt + sample.token_ids], device=engine.model.device)
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1 : -1].float().cpu() / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(sample.token_ids)[:, None]).squeeze(1)


def test_chat_template_and_prompt_encoding(engine):
    ids = engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert engine.tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert engine.tokenizer.decode(engine.encode_prompt("12+7=")) == "12+7="


def test_custom_chat_template_replaces_the_tokenizers(model_dir):
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}A:"
    engine = make_engine(model_dir, chat_template=template)
    ids = engine.apply_chat_template([{"role": "user", "content": "2+2="}])
    assert engine.tokenizer.decode(ids) == "user: 2+2=\nA:"


def test_greedy_matches_hf_generate(sharp_engine, prompts):
    # 80 new tokens also exercises the KV buffer growing past its first 64 columns.
    engine = sharp_engine
    params = [SamplingParams(temperature=0, max_tokens=80)] * len(prompts)
    outputs = engine.generate(prompts, params)
    reference = hf_greedy(engine, prompts, max_new_tokens=80)
    for out, ref in zip(outputs, reference, strict=True):
        assert len(out) == 1
        assert out[0].token_ids == ref
        assert out[0].finish_reason == ("stop" if ref[-1] in engine.eos_ids else "length")
    # rows finished at 3 different steps, so finished rows were dropped mid-batch
    assert len({len(out[0].token_ids) for out in outputs}) == 3


def test_mixed_batch_and_duplicate_prompts_keep_greedy_rows_exact(sharp_engine, prompts):
    # A greedy request batched with sampled requests (and a duplicate prompt) is unaffected.
    params = [
        SamplingParams(temperature=0),
        SamplingParams(n=3, temperature=1.0, top_k=5),
        SamplingParams(temperature=0),
        SamplingParams(n=2, temperature=0.7, top_p=0.8),
        SamplingParams(temperature=0),
    ]
    batch = [prompts[0], prompts[1], prompts[2], prompts[3], prompts[0]]
    outputs = sharp_engine.generate(batch, params)
    assert [len(o) for o in outputs] == [1, 3, 1, 2, 1]
    reference = hf_greedy(sharp_engine, [prompts[0], prompts[2]], max_new_tokens=48)
    assert outputs[0][0].token_ids == reference[0] == outputs[4][0].token_ids
    assert outputs[2][0].token_ids == reference[1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_full_forward(engine, prompts, temperature):
    # top-k/top-p change which tokens can be drawn, not the reported logprobs.
    params = [SamplingParams(n=2, temperature=temperature, top_k=20, top_p=0.9, seed=5)] * 4
    outputs = engine.generate(prompts, params)
    for prompt, samples in zip(prompts, outputs, strict=True):
        for sample in samples:
            expected = recomputed_logprobs(engine, prompt, sample, temperature)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)


def test_greedy_logprobs_use_temperature_one(engine, prompts):
    (sample,) = engine.generate(prompts[:1], [SamplingParams(temperature=0)])[0]
    expected = recomputed_logprobs(engine, prompts[0], sample, 1.0)
    assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)


def test_seeded_samples_are_reproducible_and_distinct(engine, prompts):
    params = SamplingParams(n=4, temperature=1.0, seed=11)
    first = engine.generate([prompts[1]], [params])[0]
    # Same seed in a different batch (other requests, other row positions): same samples.
    again = engine.generate([prompts[0], prompts[1]], [SamplingParams(n=3), params])[1]
    assert [s.token_ids for s in first] == [s.token_ids for s in again]
    assert len({tuple(s.token_ids) for s in first}) == 4  # the n samples differ
    other = engine.generate([prompts[1]], [SamplingParams(n=4, temperature=1.0, seed=12)])[0]
    assert [s.token_ids for s in other] != [s.token_ids for s in first]


def test_engine_seed_makes_unseeded_runs_reproducible(model_dir, prompts):
    runs = []
    for _ in range(2):
        engine = make_engine(model_dir, seed=3)
        runs.append([s.token_ids for s in engine.generate([prompts[0]], [SamplingParams(n=3)])[0]])
    assert runs[0] == runs[1]


def test_min_max_tokens_and_stop_ids(engine, prompts):
    # Every token but "x" is a stop id: the first token allowed to stop ends the sample
    # (while stops are masked only "x" can be drawn).
    x_id = engine.encode_prompt("x")[0]
    almost_all = [i for i in range(len(engine.tokenizer)) if i != x_id]
    stop_now = SamplingParams(n=2, min_tokens=0, stop_token_ids=almost_all, seed=1)
    stop_after_5 = SamplingParams(n=2, min_tokens=5, stop_token_ids=almost_all)
    # min == max: eos is masked throughout, so exactly 7 tokens, none of them eos.
    exactly_7 = SamplingParams(n=2, min_tokens=7, max_tokens=7)
    outputs = engine.generate(prompts[:3], [stop_now, stop_after_5, exactly_7])
    for s in outputs[0]:  # 1 token, or a run of "x" then a stop
        assert s.token_ids[:-1] == [x_id] * (len(s.token_ids) - 1)
        assert s.finish_reason == "stop" and s.token_ids[-1] != x_id
    for s in outputs[1]:
        assert s.token_ids[:5] == [x_id] * 5 and s.finish_reason == "stop"
    for s in outputs[2]:
        assert len(s.token_ids) == 7 and s.finish_reason == "length"
        assert not set(s.token_ids) & set(engine.eos_ids)
        assert len(s.logprobs) == 7

    # Stop on the 3rd greedy token: output ends at its first occurrence, inclusive.
    (greedy,) = engine.generate(prompts[:1], [SamplingParams(temperature=0, min_tokens=0)])[0]
    stop_id = greedy.token_ids[2]
    params = SamplingParams(temperature=0, min_tokens=0, stop_token_ids=[stop_id])
    (stopped,) = engine.generate(prompts[:1], [params])[0]
    assert stopped.token_ids == greedy.token_ids[: greedy.token_ids.index(stop_id) + 1]
    assert stopped.finish_reason == "stop"


def test_prompt_truncation_keeps_the_tail_and_warns_once(model_dir, caplog):
    engine = make_engine(model_dir, max_prompt_tokens=10)
    long_prompt = engine.encode_prompt("abcdefghijklmnopqrstuvwxyz")
    with caplog.at_level(logging.WARNING):
        outputs = engine.generate([long_prompt] * 2, [SamplingParams(max_tokens=3)] * 2)
    assert outputs[0][0].prompt_token_ids == long_prompt[-10:]
    assert engine.tokenizer.decode(outputs[1][0].prompt_token_ids) == "qrstuvwxyz"
    assert sum("truncated" in r.message for r in caplog.records) == 1


def test_without_truncation_max_tokens_is_capped_to_fit(model_dir):
    engine = make_engine(
        model_dir, max_model_len=30, max_prompt_tokens=10, enable_prompt_truncation=False
    )
    prompt = engine.encode_prompt("x" * 25)  # 25 + 48 > 30: only 5 new tokens fit
    (sample,) = engine.generate([prompt], [SamplingParams(min_tokens=48)])[0]
    assert sample.prompt_token_ids == prompt
    assert len(sample.token_ids) == 5 and sample.finish_reason == "length"
    with pytest.raises(ValueError, match="no room to generate within max_model_len=30"):
        engine.generate([engine.encode_prompt("x" * 30)], [SamplingParams()])


def test_chunking_by_max_num_seqs_gives_same_results(sharp_engine, model_dir, prompts):
    params = [SamplingParams(n=2, temperature=0)] * len(prompts)
    whole = sharp_engine.generate(prompts, params)
    chunked_engine = sharpened(make_engine(model_dir, max_num_seqs=3))
    chunked = chunked_engine.generate(prompts, params)  # chunks of one prompt (2 rows) each
    assert [[s.token_ids for s in o] for o in whole] == [[s.token_ids for s in o] for o in chunked]


def test_repetition_penalty_matches_hf(model_dir, prompts):
    engine = sharpened(make_engine(model_dir, repetition_penalty=1.5))
    for prompt in prompts[:2]:  # one prompt at a time: HF also penalises pad tokens
        (out,) = engine.generate([prompt], [SamplingParams(temperature=0)])[0]
        (ref,) = hf_greedy(engine, [prompt], max_new_tokens=48, repetition_penalty=1.5)
        (plain,) = hf_greedy(engine, [prompt], max_new_tokens=48)
        assert out.token_ids == ref != plain  # the penalty changed the output


def test_load_state_dict_swaps_weights(model_dir, tmp_path, prompts):
    other_dir = build_tiny_model(str(tmp_path / "other"), **TINY_PRESETS["micro"], seed=1)
    engine, other = make_engine(model_dir), make_engine(other_dir)
    params = [SamplingParams(n=2, temperature=1.0, seed=0)]  # seeded: same noise for both
    before = [s.token_ids for s in engine.generate(prompts[:1], params)[0]]
    target = [s.token_ids for s in other.generate(prompts[:1], params)[0]]
    assert before != target

    weights = AutoModelForCausalLM.from_pretrained(other_dir).state_dict()
    assert set(weights) <= set(engine.state_dict_keys())
    engine.load_state_dict(weights)
    assert [s.token_ids for s in engine.generate(prompts[:1], params)[0]] == target

    with pytest.raises(KeyError, match="unknown key"):
        engine.load_state_dict({"model.not_a_layer.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        engine.load_state_dict({"model.norm.weight": torch.zeros(3)})


def test_empty_and_mismatched_batches(engine, prompts):
    assert engine.generate([], []) == []
    with pytest.raises(ValueError, match="2 prompts but 1 SamplingParams"):
        engine.generate(prompts[:2], [SamplingParams()])


@pytest.mark.parametrize(
    "kwargs", [dict(n=0), dict(temperature=-1), dict(top_p=0), dict(max_tokens=0)]
)
def test_invalid_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------- sampling math


def test_filter_top_k_top_p_by_hand():
    # Row probabilities 0.5, 0.3, 0.15, 0.05 (log-probs as logits), listed in a shuffled
    # order in the last row to check that the filter maps back to vocabulary positions.
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log().repeat(5, 1)
    logits[4] = p[[2, 0, 3, 1]].log()
    top_k = torch.tensor([2, -1, -1, 3, 2])
    # Mass of strictly more likely tokens: 0, 0.5, 0.8, 0.95. Top-p drops a token when
    # that mass already reaches p: p=0.7 keeps 2 tokens, p=0.5 keeps 1, p=0.81 keeps 3.
    top_p = torch.tensor([1.0, 0.7, 0.5, 0.9, 1.0])
    probs = sampling.filter_top_k_top_p(logits, top_k, top_p).softmax(-1)
    expected = torch.tensor(
        [
            [0.625, 0.375, 0, 0],  # top-2: 0.5 / 0.8, 0.3 / 0.8
            [0.625, 0.375, 0, 0],  # top-p 0.7
            [1.0, 0, 0, 0],  # top-p 0.5
            # top-3 renormalised to 0.526, 0.316, 0.158: masses before 0, 0.53, 0.84 < 0.9
            [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
            [0, 0.625, 0, 0.375],  # shuffled row, top-2
        ]
    )
    assert torch.allclose(probs, expected, atol=1e-6)


def test_repetition_penalty_by_hand():
    logits = torch.tensor([[2.0, -1.0, 3.0]])
    seen = torch.tensor([[True, True, False]])
    # seen positive logit divided by 2, seen negative multiplied by 2, unseen untouched
    out = sampling.apply_repetition_penalty(logits, seen, 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -2.0, 3.0]]))


def test_sample_tokens_exponential_race():
    logits = torch.tensor([0.5, 0.3, 0.2]).log().repeat(2, 1)
    noise = torch.tensor([[1.0, 0.1, 1.0], [1.0, 0.1, 1.0]])
    # p / E = [0.5, 3.0, 0.2] -> token 1 for the sampled row; the greedy row takes argmax 0
    greedy = torch.tensor([True, False])
    assert sampling.sample_tokens(logits, greedy, noise).tolist() == [0, 1]
    # With Exp(1) noise, frequencies follow the probabilities.
    gen = torch.Generator().manual_seed(0)
    rows = 20000
    noise = sampling.exponential_noise((rows, 3), gen, torch.device("cpu"))
    # Exp(1): mean 1, P(E > 1) = 1/e, never infinite.
    assert torch.isfinite(noise).all() and (noise >= 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.02
    assert abs((noise > 1).float().mean().item() - 0.3679) < 0.01
    picks = sampling.sample_tokens(logits[:1].expand(rows, 3), torch.zeros(rows, dtype=bool), noise)
    freq = torch.bincount(picks, minlength=3) / rows
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_inverse_cdf_sample_by_hand():
    # running sums 0.2, 0.2, 0.7, 1.0 (block 2: masses 0.2 | 0.5 | 0.3 + padding); the token
    # is the first whose running sum exceeds u
    weights = torch.tensor([[0.2, 0.0, 0.5, 0.3, 0.0]]).expand(6, 5)
    uniform = torch.tensor([0.0, 0.1, 0.25, 0.69, 0.71, 1 - 2**-53], dtype=torch.float64)
    picks = sampling.inverse_cdf_sample(weights, uniform, block=2)
    assert picks.tolist() == [0, 0, 2, 2, 3, 3]  # never a token of weight 0, nor padding
    # unnormalised weights: the same picks
    assert sampling.inverse_cdf_sample(weights * 7, uniform, block=2).tolist() == picks.tolist()


def test_inverse_cdf_sample_keeps_a_tiny_weight_in_a_large_vocabulary():
    """150,000 tokens of weight 1 and one of 1e-3 (7e-9 of the mass, under float32's
    resolution at a running sum of 140,000): the u in the middle of its interval picks it."""
    weights = torch.ones(1, 150_000)
    weights[0, 140_000] = 1e-3
    total = 149_999 + 1e-3
    uniform = torch.tensor([(140_000 + 5e-4) / total, (140_000 - 0.5) / total], dtype=torch.float64)
    picks = sampling.inverse_cdf_sample(weights.expand(2, -1), uniform)
    assert picks.tolist() == [140_000, 139_999]


def test_inverse_cdf_sample_frequencies_follow_the_weights():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1000, generator=gen) * 2, dim=0)
    rows = 200_000
    uniform = torch.rand(rows, generator=gen, dtype=torch.float64)
    picks = sampling.inverse_cdf_sample(probs.expand(rows, -1), uniform, block=64)
    counts = torch.bincount(picks, minlength=1000).double()
    expected = probs.double() * rows
    # Pearson's chi-square over 999 degrees of freedom: mean 999, sd sqrt(2 * 999) = 44.7;
    # probabilities off by 10% (relative) would add about 0.1**2 * rows = 2,000
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 999 + 5 * 44.7


@pytest.mark.parametrize("temperature,top_k", [(0.7, -1), (1.0, 3)])
def test_engine_first_token_frequencies_follow_the_model(sharp_engine, prompts, temperature, top_k):
    params = SamplingParams(
        n=3000, temperature=temperature, top_k=top_k, max_tokens=1, min_tokens=0
    )
    (samples,) = sharp_engine.generate([prompts[1]], [params])
    with torch.no_grad():
        logits = sharp_engine.model(torch.tensor([prompts[1]])).logits[0, -1] / temperature
    if top_k > 0:
        logits[logits < logits.topk(top_k).values[-1]] = float("-inf")
    expected = logits.softmax(-1)
    picks = torch.tensor([s.token_ids[0] for s in samples])
    freq = torch.bincount(picks, minlength=len(expected)) / len(picks)
    assert torch.allclose(freq, expected, atol=0.03)
    assert set(picks.tolist()) <= set(expected.nonzero().squeeze(1).tolist())


@pytest.mark.gpu
def test_cuda_engine_agrees_with_the_cpu_engine(model_dir, prompts):
    """The same weights on CUDA in fp32: the same greedy tokens and logprobs as on CPU."""
    cpu = sharpened(make_engine(model_dir))
    cuda = sharpened(make_engine(model_dir, device="cuda"))
    params = [SamplingParams(temperature=0, max_tokens=32)] * len(prompts)
    for (ref,), (out,) in zip(
        cpu.generate(prompts, params), cuda.generate(prompts, params), strict=True
    ):
        assert out.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=1e-3)


@pytest.mark.gpu
def test_cuda_bf16_logprobs_match_a_bf16_full_forward(model_dir, prompts):
    """What the trainer recomputes in the same dtype; bf16 rounding differs between the
    cached and the full pass, hence the looser tolerance."""
    engine = make_engine(model_dir, device="cuda", dtype="bfloat16")
    outputs = engine.generate(prompts, [SamplingParams(n=8, temperature=1.0)] * len(prompts))
    for prompt, samples in zip(prompts, outputs, strict=True):
        assert len(samples) == 8
        for sample in samples:
            expected = recomputed_logprobs(engine, prompt, sample, 1.0)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=0.05)


def test_stop_strings_end_a_sample_at_the_token_that_completes_them(sharp_engine, prompts):
    (greedy,) = sharp_engine.generate(prompts[1:2], [SamplingParams(temperature=0, min_tokens=0)])[
        0
    ]
    text = sharp_engine.tokenizer.decode(greedy.token_ids, skip_special_tokens=True)
    stop = text[3:5]  # two characters the greedy answer produces at its 4th-5th character
    assert stop and stop in text
    params = SamplingParams(temperature=0, min_tokens=0, stop=[stop, "never-there"])
    (cut,) = sharp_engine.generate(prompts[1:2], [params])[0]
    # the same greedy tokens, up to the first whose text holds the stop string
    assert cut.token_ids == greedy.token_ids[: len(cut.token_ids)]
    shown = sharp_engine.tokenizer.decode(cut.token_ids, skip_special_tokens=True)
    before = sharp_engine.tokenizer.decode(cut.token_ids[:-1], skip_special_tokens=True)
    assert stop in shown and stop not in before
    assert cut.finish_reason == "stop"


def test_top_logprobs_are_the_most_likely_tokens_under_the_tempered_model(sharp_engine, prompts):
    params = [SamplingParams(n=2, temperature=0.7, top_logprobs=3, seed=4), SamplingParams()]
    asked, plain = sharp_engine.generate(prompts[:2], params)
    assert all(s.top_logprobs is None for s in plain)
    for sample in asked:
        assert len(sample.top_logprobs) == len(sample.token_ids)
        full = recomputed_logprobs(sharp_engine, prompts[0], sample, 0.7)
        for t, alternatives in enumerate(sample.top_logprobs):
            ids = [i for i, _ in alternatives]
            values = torch.tensor([v for _, v in alternatives])
            assert len(ids) == 3 and values.tolist() == sorted(values.tolist(), reverse=True)
            assert abs(values[0].item() - _best_logprob(sharp_engine, prompts[0], sample, t)) < 1e-3
        # the sampled token's logprob is among the alternatives whenever it ranks in the top 3
        for t, (token, alternatives) in enumerate(
            zip(sample.token_ids, sample.top_logprobs, strict=True)
        ):
            if token in [i for i, _ in alternatives]:
                assert abs(dict(alternatives)[token] - full[t].item()) < 1e-3


def _best_logprob(engine, prompt, sample, t, temperature=0.7) -> float:
    """The largest logprob at response position ``t`` (one full forward pass)."""
    ids = torch.tensor([prompt + sample.token_ids], device=engine.model.device)
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(prompt) - 1 + t].float().cpu() / temperature
    return logits.log_softmax(-1).max().item()


def test_tools_reach_the_chat_template(model_dir):
    template = (
        "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    engine = make_engine(model_dir, chat_template=template)
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    ids = engine.apply_chat_template([{"role": "user", "content": "1+1"}], tools=[tool])
    text = engine.tokenizer.decode(ids)
    assert (
        text.startswith("<tools>[") and '"name": "add"' in text and text.endswith("<|assistant|>")
    )
    plain = engine.tokenizer.decode(engine.apply_chat_template([{"role": "user", "content": "1"}]))
    assert "<tools>" not in plain


def test_release_frees_the_weights_until_a_full_load(tmp_path, prompts):
    """mode: colocate: the engine gives its weights' memory up while the trainer steps; the
    process's resident memory drops by about their size, and a full state dict brings back
    exactly the engine it was."""
    import psutil

    # a real vocabulary's embedding (16 MB) makes the drop stand out of the process's noise
    shape = dict(TINY_PRESETS["micro"], vocab_size=65536)
    engine = make_engine(build_tiny_model(str(tmp_path / "m"), **shape))
    greedy = [SamplingParams(n=1, temperature=0.0, max_tokens=8)] * len(prompts)
    before = [o[0].token_ids for o in engine.generate(prompts, greedy)]
    weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
    size = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    rss = psutil.Process().memory_info().rss
    assert engine.release() == size
    assert psutil.Process().memory_info().rss < rss - 0.8 * size
    assert all(p.numel() == 0 for p in engine.model.parameters())
    assert engine.release() == 0  # already released
    with pytest.raises(RuntimeError, match="released"):
        engine.generate(prompts, greedy)
    with pytest.raises(KeyError, match="needs every weight"):
        engine.load_state_dict({"lm_head.weight": weights["lm_head.weight"]})
    assert all(p.numel() == 0 for p in engine.model.parameters())  # nothing half-restored
    engine.load_state_dict(weights)
    assert [o[0].token_ids for o in engine.generate(prompts, greedy)] == before


# A template with Qwen3's switch: a generation prompt that opens an empty think block when
# enable_thinking is false, as Qwen3's own template does.
SWITCH_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)


@pytest.mark.parametrize("enable_thinking, block", [(False, True), (True, False)])
def test_enable_thinking_reaches_the_chat_template(model_dir, enable_thinking, block):
    engine = make_engine(model_dir, chat_template=SWITCH_TEMPLATE, enable_thinking=enable_thinking)
    text = engine.render_chat([{"role": "user", "content": "1+2="}])
    assert text.startswith("<|user|>1+2=\n<|assistant|>")
    assert text.endswith("<think></think>") is block
    assert engine.apply_chat_template([{"role": "user", "content": "1+2="}]) == (
        engine.tokenizer.encode(text, add_special_tokens=False)
    )


@pytest.mark.parametrize(
    "device, decoder",
    [
        ("cpu", "static"),
        pytest.param("cuda", "static", marks=pytest.mark.gpu),
        pytest.param("cuda", "graphs", marks=pytest.mark.gpu),
    ],
)
def test_static_decoders_sample_what_the_growing_ones_do(model_dir, prompts, device, decoder):
    """Same seed, same tokens and logprobs as decoder auto: sampled, greedy and top-k rows
    finishing at different steps; a second batch of another shape; the buffers (and graph)
    rebuilt after the weights are released and loaded again (mode: colocate)."""
    engines = [
        sharpened(make_engine(model_dir, device=device, seed=7, decoder=d))
        for d in ("auto", decoder)
    ]
    batches = [
        (prompts, [SamplingParams(n=4, temperature=1.0), SamplingParams(temperature=0)] * 2),
        (prompts[1:2], [SamplingParams(n=3, temperature=0.8, top_k=5, max_tokens=70)]),
    ]
    outputs = [[], []]
    for i, engine in enumerate(engines):
        for batch, params in batches:
            outputs[i] += [s for group in engine.generate(batch, params) for s in group]
        weights = {k: v.clone() for k, v in engine.model.state_dict().items()}
        engine.release()
        engine.load_state_dict(weights)
        outputs[i] += [s for group in engine.generate(*batches[0]) for s in group]
    reference, static = outputs
    assert len({len(s.token_ids) for s in reference}) > 3  # rows ended at different steps
    for ref, out in zip(reference, static, strict=True):
        assert out.token_ids == ref.token_ids and out.finish_reason == ref.finish_reason
        # sharpened weights: logits up to ~75, so fp32 attention summed in another
        # order (cascade against padded SDPA) moves logprobs by ~1e-4 of their logits
        torch.testing.assert_close(out.logprobs, ref.logprobs, atol=2e-3, rtol=0)
    assert engines[1]._slots.rows == 16  # 10 rows of the first batch, bucketed


def test_decoder_choice_is_checked(model_dir):
    with pytest.raises(ValueError, match="decoder must be one of"):
        make_engine(model_dir, decoder="paged")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_engine(model_dir, decoder="graphs")


def test_logprobs_are_tempered_after_rows_of_temperature_1_are_joined_by_others():
    """Rows at temperature 1 skip the division; once a row at 0.5 joins, its logprobs are
    log_softmax(logits / 0.5) and the first rows' stay log_softmax(logits)."""
    from trinity.common.models.sampling import SamplingParams

    def rows(temperature: float, owner: int, first: int) -> sampling.RowSampler:
        params = SamplingParams(n=1, temperature=temperature, max_tokens=4, min_tokens=0)
        return sampling.RowSampler.build([params], [owner], torch.tensor([first]), [0], 1.0, None)

    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5], [2.0, 1.0, -1.0, 0.5]])
    sampler = rows(1.0, 0, 0)
    assert sampler.unit_temperature
    sampler.join(rows(0.5, 1, 1))
    assert not sampler.unit_temperature
    tokens, logprobs, _ = sampler.sample(logits, torch.Generator().manual_seed(0))
    want = [logits[0].log_softmax(-1)[tokens[0]], (logits[1] / 0.5).log_softmax(-1)[tokens[1]]]
    torch.testing.assert_close(logprobs, torch.stack(want))
