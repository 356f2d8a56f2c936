"""bf16 compute weights cast once per step (``utils/compute_weights.py``) against plain autocast.

Both sides run the same bf16 products on the same bf16 values (a copy made by ``copy_`` rounds
as autocast's cast does), so the loss and the logprobs agree to float summation order. The
one planned difference is the output head's gradient: the chunked head (``token_scores``)
sums it in fp32 and hands it to its weight in that weight's dtype, so with the copy it is
rounded to bf16 once per micro-batch before the fp32 accumulation: a relative error of at
most 2**-9 per micro-batch, hence ``RTOL`` = 2**-8 for a few micro-batches (plus a tiny
absolute term for entries that cancel to about zero).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.algorithm import ENTROPY_LOSS_FN, KL_FN, POLICY_LOSS_FN
from trinity.common.experience import Experience, ExperienceBatch
from trinity.trainer.policy_step import LossFns, accumulate_gradients
from trinity.utils.device import compute_in, compute_weights, plain_autocast

RTOL = 2**-8
ATOL = 1e-6


def _batch(n: int = 6) -> ExperienceBatch:
    exps = [
        Experience(
            tokens=list(range(5 + i, 14 + i % 3)),
            prompt_length=3 + i % 2,
            advantages=None,
            reward=float(i % 2),
        )
        for i in range(n)
    ]
    batch = ExperienceBatch.from_experiences(exps, pad_token_id=0)
    batch.advantages = (torch.arange(n, dtype=torch.float32)[:, None] - n / 2) * batch.action_mask
    batch.old_logprob = torch.zeros_like(batch.action_mask, dtype=torch.float32)
    return batch


def _fns() -> LossFns:
    return LossFns(
        POLICY_LOSS_FN.get("ppo")(), KL_FN.get("none")(), ENTROPY_LOSS_FN.get("default")()
    )


def _pair(path: str, **kwargs):
    """(cached, plain autocast) bf16 copies of one model."""
    cached = compute_in(AutoModelForCausalLM.from_pretrained(path, **kwargs), torch.bfloat16)
    plain = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    plain = plain_autocast(compute_in(plain, torch.bfloat16))
    return cached, plain


def _step(model, optimizer, batch, fns):
    optimizer.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, batch, fns, micro_batch_size=2)  # 3 micro-batches
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer.step()
    return metrics, grads


def _close_grads(cached, plain):
    assert cached.keys() == plain.keys()
    for name, grad in plain.items():
        assert cached[name].dtype == torch.float32, name
        assert torch.allclose(cached[name], grad, rtol=RTOL, atol=ATOL), name


def test_two_steps_match_autocast_with_fp32_masters_and_optimizer_state(micro_model):
    """One cast per master and step; every gradient and the second step's loss (after the
    optimizer moved the masters: the copies must be refreshed) equal autocast's."""
    cached, plain = _pair(micro_model)
    fns, batch = _fns(), _batch()
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (cached, plain)]
    weights = compute_weights(cached)
    masters = len(weights.masters)
    for step in range(2):
        (m_c, g_c), (m_p, g_p) = (
            _step(cached, opts[0], batch, fns),
            _step(plain, opts[1], batch, fns),
        )
        assert m_c["pg_loss"] == pytest.approx(m_p["pg_loss"], rel=1e-5, abs=1e-6)
        _close_grads(g_c, g_p)
        assert weights.casts == masters * (step + 1)  # once per step, not per micro-batch
    # the masters are what the optimizer steps, checkpoints save and syncs publish
    assert {t.dtype for t in cached.state_dict().values()} == {torch.float32}
    assert all(p.dtype == torch.float32 for p in cached.parameters())
    for state in opts[0].state.values():
        assert {v.dtype for v in state.values() if v.dim()} == {torch.float32}
    # the steps did move the weights, and both sides the same way
    for (name, a), b in zip(cached.named_parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), name


def test_tied_head_and_embedding_share_one_copy_and_sum_their_gradients(micro_model):
    cached, plain = _pair(micro_model)
    head, embed = cached.get_output_embeddings(), cached.get_input_embeddings()
    assert head.weight is embed.weight  # the fixture's model ties them
    weights = compute_weights(cached)
    assert sum(1 for s in weights.slots if s[2] is head.weight) == 1
    fns, batch = _fns(), _batch()
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (cached, plain)]
    _, g_c = _step(cached, opts[0], batch, fns)
    _, g_p = _step(plain, opts[1], batch, fns)
    assert cached.get_output_embeddings().weight is cached.get_input_embeddings().weight
    _close_grads(g_c, g_p)


def test_frozen_weights_are_cast_once_across_passes(micro_model):
    """A scoring-only model (reference, teacher) keeps its copies until its weights change."""
    from trinity.trainer.policy_step import response_scores

    model = compute_in(AutoModelForCausalLM.from_pretrained(micro_model), torch.bfloat16)
    model.requires_grad_(False)
    weights, batch = compute_weights(model), _batch()
    first = response_scores(model, batch, 2, 1.0)[0]
    casts = weights.casts
    assert torch.equal(response_scores(model, batch, 2, 1.0)[0], first)
    assert weights.casts == casts  # no new cast
    with torch.no_grad():  # a load of weights (a sync, a resume) writes the masters
        model.load_state_dict({k: v * 1.5 for k, v in model.state_dict().items()})
    assert not torch.equal(response_scores(model, batch, 2, 1.0)[0], first)
    assert weights.casts == 2 * casts


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_recomputes_from_the_masters(micro_model, reentrant):
    """The recomputation in backward runs after the pass put the masters back: autocast casts
    them there to the same bf16 values the copies hold, and their gradients reach the
    masters directly; the parts outside the checkpointed layers (the head) use the copies."""
    cached, plain = _pair(micro_model)
    for model in (cached, plain):
        model.gradient_checkpointing_enable({"use_reentrant": reentrant})
        model.train()
    fns, batch = _fns(), _batch()
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (cached, plain)]
    (m_c, g_c), (m_p, g_p) = _step(cached, opts[0], batch, fns), _step(plain, opts[1], batch, fns)
    assert m_c["pg_loss"] == pytest.approx(m_p["pg_loss"], rel=1e-5, abs=1e-6)
    _close_grads(g_c, g_p)
    assert compute_weights(cached).casts == len(compute_weights(cached).masters)


def test_lora_adapter_refreshed_each_step_and_frozen_base_cast_once(micro_model):
    peft = pytest.importorskip("peft")
    config = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    models = []
    for _ in range(2):
        base = AutoModelForCausalLM.from_pretrained(micro_model)
        torch.manual_seed(0)  # the same random adapter on both sides
        lora_model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **config))
        models.append(compute_in(lora_model, torch.bfloat16))
    cached, plain = models[0], plain_autocast(models[1])
    weights = compute_weights(cached)
    trainable = sum(1 for master, _ in weights.masters.values() if master.requires_grad)
    assert 0 < trainable < len(weights.masters)
    fns, batch = _fns(), _batch()
    opts = [
        torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.05)
        for m in (cached, plain)
    ]
    for step in range(2):
        (m_c, g_c), (m_p, g_p) = (
            _step(cached, opts[0], batch, fns),
            _step(plain, opts[1], batch, fns),
        )
        assert m_c["pg_loss"] == pytest.approx(m_p["pg_loss"], rel=1e-5, abs=1e-6)
        _close_grads(g_c, g_p)
        assert weights.casts == len(weights.masters) + trainable * step


TRAINER_CONFIG = """
project: tests
name: bf16
cluster: {{gpu_per_node: 0}}
checkpoint_root_dir: {root}
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 4}}
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  optimizer: {{lr: 0.01}}
  kl_loss_fn_args: {{kl_coef: 0.1}}
buffer:
  batch_size: 2
  total_steps: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset: {{name: train, path: {data}, split: train,
               format: {{prompt_key: question, response_key: answer}}}}
trainer:
  trainer_config:
    actor_rollout_ref:
      actor: {{ppo_micro_batch_size_per_gpu: 1,
               fsdp_config: {{mixed_precision: {{param_dtype: bf16}}}}}}
      ref: {{fsdp_config: {{mixed_precision: {{param_dtype: bf16}}}}}}
"""


def _trainer(root, micro_model, arithmetic_data):
    from trinity.common.config import load_config
    from trinity.preflight.derive import finalize
    from trinity.trainer.trainer import Trainer

    path = root / "config.yaml"
    root.mkdir()
    text = TRAINER_CONFIG.format(root=root / "ck", model=micro_model, data=arithmetic_data["rl"])
    path.write_text(text)
    trainer = Trainer(finalize(load_config(str(path))), 4, log=lambda metrics, step: None)
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    return trainer


def _rows(tokenizer, step):
    prompt = tokenizer.encode(f"{step}+1=")
    return [
        Experience(
            tokens=prompt + tokenizer.encode(answer),
            prompt_length=len(prompt),
            reward=reward,
            logprobs=[-1.0] * len(answer),
            group_id="g",
        )
        for answer, reward in (("2", 1.0), ("37", 0.0), ("3", 0.0), ("41", 1.0))
    ]


def test_trainer_steps_match_autocast_and_save_fp32(tmp_path, micro_model, arithmetic_data):
    """Trainer.train_step (micro-batches of one row, a bf16 reference model) twice, cached
    against plain autocast: the same losses and grad norms; the checkpoint is fp32."""
    from safetensors import safe_open

    from trinity.common.weights import weights_path

    cached = _trainer(tmp_path / "cached", micro_model, arithmetic_data)
    plain = _trainer(tmp_path / "plain", micro_model, arithmetic_data)
    plain_autocast(plain.model)
    plain_autocast(plain.ref_model)
    assert compute_weights(cached.ref_model) is not None
    for step in (1, 2):
        results = []
        for trainer in (cached, plain):
            trainer.step = step
            results.append(trainer.train_step(_rows(trainer.tokenizer, step)))
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert results[0][key] == pytest.approx(results[1][key], rel=RTOL, abs=1e-6), key
    assert compute_weights(cached.ref_model).casts == len(compute_weights(cached.ref_model).masters)
    cached.save(final=True)
    with safe_open(weights_path(cached.job_dir, 2), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
