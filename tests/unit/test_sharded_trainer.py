"""Two trainer ranks (FSDP2 over gloo) against one: the same step, checkpoints, weights.

One module fixture runs the 2-rank side once in two spawned processes: a GRPO step on a
batch the ranks split unevenly (with a reference model, and micro-batches of 2 rows so one
rank also runs a zero-weight pass), a sharded save, and a resume into fresh ranks. Rank 0
writes what it saw to files; the tests compare them with a 1-rank ``Trainer`` in this process,
and with three ranks resuming the same checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from trinity.common.weights import weights_path
from trinity.preflight.derive import finalize
from trinity.trainer import checkpoint as ckpt
from trinity.trainer.distributed import split_rows

CONFIG = """
project: tests
cluster: {{gpu_per_node: 0}}  # gloo ranks on CPU, also on a machine with a GPU
name: sharded
checkpoint_root_dir: {root}
continue_from_checkpoint: true
model: {{model_path: {model}, max_prompt_tokens: 40, max_response_tokens: 8}}
algorithm: {{algorithm_type: grpo, repeat_times: 3, optimizer: {{lr: 0.001}}}}
buffer:
  batch_size: 2
  total_steps: 4
  explorer_input:
    default_workflow_type: math_workflow
    taskset: {{name: train, path: {data}, split: train,
               format: {{prompt_key: question, response_key: answer}}}}
trainer:
  cpu_ranks: {ranks}
  use_dynamic_bsz: false
  trainer_config: {{actor_rollout_ref: {{actor: {{ppo_micro_batch_size_per_gpu: 2}}}}}}
"""

# Two groups of three; one long response, so the token-balanced split is uneven (2 and 4).
ROWS = [("g0", "1+1=", "2", 1.0), ("g0", "1+1=", "3", 0.0), ("g0", "1+1=", "2" * 16, 0.0)]
ROWS += [("g1", "2+2=", "4", 1.0), ("g1", "2+2=", "8", 0.0), ("g1", "2+2=", "5", 1.0)]


def write_config(root: str, model: str, data: str, ranks: int) -> str:
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "config.yaml")
    with open(path, "w") as f:
        f.write(textwrap.dedent(CONFIG.format(root=root, model=model, data=data, ranks=ranks)))
    return path


def experiences(tokenizer) -> list:
    from trinity.common.experience import Experience

    out = []
    for group, prompt, answer, reward in ROWS:
        p, r = tokenizer.encode(prompt), tokenizer.encode(answer)
        logprobs = [-0.5 - 0.1 * i for i in range(len(r))]
        out.append(Experience(p + r, len(p), reward=reward, logprobs=logprobs, group_id=group))
    return out


def _grads(model: torch.nn.Module) -> dict:
    """Every parameter's gradient, whole (collective when sharded)."""
    out = {}
    for name, param in model.named_parameters():
        grad = param.grad
        out[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad.clone()
    return out


def _optimizer_tensors(trainer) -> dict:
    """The optimizer's state tensors by parameter name (whole; collective when sharded)."""
    names = [n for n, _ in trainer.model.named_parameters()]
    out = {}
    for index, state in trainer.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            whole = value.full_tensor() if hasattr(value, "full_tensor") else value
            out[f"{names[index]}.{key}"] = whole.reshape(-1).clone()
    return out


def _rank_main(rank: int, world: int, port: int, config_path: str, out: str) -> None:
    """One rank of the 2-rank side: step, save, then resume into a fresh trainer."""
    from trinity.common.config import load_config
    from trinity.trainer.distributed import close_group, init_group
    from trinity.trainer.sharded import ShardedTrainer

    torch.set_num_threads(1)
    ranks = init_group(rank, world, port, timeout_s=300)
    config = finalize(load_config(config_path))
    trainer = ShardedTrainer(config, 4, log=lambda metrics, step: None, ranks=ranks)
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    trainer.step = 1
    metrics = trainer.train_step(experiences(trainer.tokenizer))
    grads, weights = _grads(trainer.model), trainer.full_state_dict()
    optim = _optimizer_tensors(trainer)
    trainer.save(final=True)
    resumed = ShardedTrainer(config, 4, log=lambda metrics, step: None, ranks=ranks)
    step = resumed.prepare_model()
    resumed_weights, resumed_optim = resumed.full_state_dict(), _optimizer_tensors(resumed)
    if rank == 0:
        save_file(grads, os.path.join(out, "grads.safetensors"))
        save_file({k: v.contiguous() for k, v in weights.items()}, f"{out}/weights.safetensors")
        save_file(optim, os.path.join(out, "optim.safetensors"))
        save_file(
            {k: v.contiguous() for k, v in resumed_weights.items()},
            os.path.join(out, "resumed_weights.safetensors"),
        )
        save_file(resumed_optim, os.path.join(out, "resumed_optim.safetensors"))
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"metrics": metrics, "resumed_step": step}, f)
    close_group()


def _resume_main(rank: int, world: int, port: int, config_path: str, out: str) -> None:
    """One of ``world`` ranks resuming the 2-rank checkpoint (resharded by DCP)."""
    from trinity.common.config import load_config
    from trinity.trainer.distributed import close_group, init_group
    from trinity.trainer.sharded import ShardedTrainer

    torch.set_num_threads(1)
    ranks = init_group(rank, world, port, timeout_s=300)
    config = finalize(load_config(config_path))
    trainer = ShardedTrainer(config, 4, log=lambda metrics, step: None, ranks=ranks)
    step = trainer.prepare_model()
    weights, optim = trainer.full_state_dict(), _optimizer_tensors(trainer)
    if rank == 0:
        save_file({k: v.contiguous() for k, v in weights.items()}, f"{out}/weights.safetensors")
        save_file(optim, os.path.join(out, "optim.safetensors"))
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"resumed_step": step}, f)
    close_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, micro_model, arithmetic_data) -> dict:
    import torch.multiprocessing as mp

    from trinity.trainer.distributed import free_port

    root = str(tmp_path_factory.mktemp("two_ranks"))
    config = write_config(os.path.join(root, "job"), micro_model, arithmetic_data["rl"], 2)
    mp.spawn(_rank_main, args=(2, free_port(), config, root), nprocs=2)
    with open(os.path.join(root, "result.json")) as f:
        result = json.load(f)
    for name in ("grads", "weights", "optim", "resumed_weights", "resumed_optim"):
        result[name] = load_file(os.path.join(root, f"{name}.safetensors"))
    from trinity.common.config import load_config

    result["job"] = finalize(load_config(config)).checkpoint_job_dir
    result["config"] = config
    return result


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, micro_model, arithmetic_data) -> dict:
    from trinity.common.config import load_config
    from trinity.trainer.trainer import Trainer

    root = str(tmp_path_factory.mktemp("one_rank"))
    config = load_config(write_config(root, micro_model, arithmetic_data["rl"], 1))
    trainer = Trainer(finalize(config), 4, log=lambda metrics, step: None)
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    trainer.step = 1
    metrics = trainer.train_step(experiences(trainer.tokenizer))
    return {
        "metrics": metrics,
        "grads": _grads(trainer.model),
        "weights": trainer.model.state_dict(),
        "optim": _optimizer_tensors(trainer),
    }


def _assert_close(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol, rtol=0), name


def test_the_batch_is_split_unevenly_between_the_ranks(micro_model):
    from transformers import AutoTokenizer

    from trinity.common.experience import ExperienceBatch

    tokenizer = AutoTokenizer.from_pretrained(micro_model)
    batch = ExperienceBatch.from_experiences(experiences(tokenizer), tokenizer.pad_token_id)
    shares = split_rows(batch.attention_mask.sum(-1).tolist(), 2, balance=True)
    assert sorted(len(s) for s in shares) == [2, 4]  # 2 micro-batches against 1


def test_balance_batch_false_keeps_contiguous_runs_per_rank():
    from types import SimpleNamespace

    from trinity.trainer.sharded import ShardedTrainer

    batch = SimpleNamespace(attention_mask=torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]))

    def shares(balance_batch, can_balance=True):
        trainer = SimpleNamespace(
            algorithm=SimpleNamespace(can_balance_batch=can_balance),
            settings={"balance_batch": balance_batch},
            ranks=SimpleNamespace(world=2),
            fns=SimpleNamespace(row_multiple=1),
        )
        return ShardedTrainer._shares(trainer, batch)

    # tokens 4, 1, 2: balanced puts the 4-token row alone; contiguous splits 2 + 1 rows
    assert shares(True) == [[0], [1, 2]]
    assert shares(False) == [[0, 1], [2]]
    assert shares(True, can_balance=False) == [[0, 1], [2]]


def test_two_ranks_step_equals_the_one_rank_step(two_ranks, one_rank):
    two, one = two_ranks["metrics"], one_rank["metrics"]
    actor = sorted(k for k in one if k.startswith("actor/"))
    assert "actor/pg_loss" in actor and "actor/kl_loss" in actor  # the reference was used
    assert actor == sorted(k for k in two if k.startswith("actor/"))
    for key in actor:
        assert two[key] == pytest.approx(one[key], abs=1e-5), key
    assert two["actor/grad_norm"] > 0
    # the mismatch metrics come from each rank's own rows, gathered back in batch order
    mismatch = sorted(k for k in one if k.startswith(("rollout_corr/", "training/rollout")))
    assert "rollout_corr/k3_kl" in mismatch
    assert mismatch == sorted(k for k in two if k.startswith(("rollout_corr/", "training/rollout")))
    for key in mismatch:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    _assert_close(two_ranks["grads"], one_rank["grads"])
    _assert_close(two_ranks["weights"], one_rank["weights"])
    _assert_close(two_ranks["optim"], one_rank["optim"])


def test_sharded_checkpoint_resumes_the_same_weights_and_optimizer(two_ranks):
    assert two_ranks["resumed_step"] == 1
    _assert_close(two_ranks["resumed_weights"], two_ranks["weights"], atol=0.0)
    _assert_close(two_ranks["resumed_optim"], two_ranks["optim"], atol=0.0)
    job = two_ranks["job"]
    step = os.path.join(job, "global_step_1")
    assert sorted(os.listdir(step)) == ["actor", "extra.json", "hf"]
    assert sorted(os.listdir(os.path.join(step, "actor"))) == [
        "model.safetensors",
        "optim.pt",
        "shards",
    ]
    shards = sorted(os.listdir(os.path.join(step, "actor", "shards")))
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    with open(os.path.join(step, "extra.json")) as f:
        assert json.load(f)["trainer_ranks"] == 2


def test_gathered_weights_are_the_export_and_the_checkpoint_weights(two_ranks):
    from transformers import AutoModelForCausalLM

    job = two_ranks["job"]
    saved = ckpt.load_weights(weights_path(job, 1))
    _assert_close({k: saved[k] for k in two_ranks["weights"]}, two_ranks["weights"], atol=0.0)
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(job, "global_step_1", "hf"))
    _assert_close(exported.state_dict(), two_ranks["weights"], atol=0.0)


def test_three_ranks_resume_the_two_rank_checkpoint(two_ranks, tmp_path):
    import torch.multiprocessing as mp

    from trinity.trainer.distributed import free_port

    mp.spawn(_resume_main, args=(3, free_port(), two_ranks["config"], str(tmp_path)), nprocs=3)
    with open(os.path.join(tmp_path, "result.json")) as f:
        assert json.load(f)["resumed_step"] == 1
    _assert_close(load_file(f"{tmp_path}/weights.safetensors"), two_ranks["weights"], atol=0.0)
    _assert_close(load_file(f"{tmp_path}/optim.safetensors"), two_ranks["optim"], atol=0.0)


def test_resuming_sharded_state_in_one_process_names_both_counts(two_ranks):
    job = two_ranks["job"]
    with pytest.raises(ckpt.CheckpointError) as excinfo:
        ckpt.load_checkpoint(job, 1, ranks=1)
    message = str(excinfo.value)
    assert "written by 2 trainer rank(s) (trainer.cpu_ranks = 2) and this run has 1" in message
    assert "resume with trainer.cpu_ranks: 2 (or any count above 1)" in message


def test_split_rows_balances_tokens_or_keeps_runs_and_pairs():
    tokens = [9, 1, 1, 1, 1, 5]
    # largest first to the lightest rank: 9 -> r0, 5 -> r1, then each 1 to r1 (6, 7, 8, 9)
    assert split_rows(tokens, 2, balance=True) == [[0], [1, 2, 3, 4, 5]]
    assert split_rows(tokens, 2, balance=False) == [[0, 1, 2], [3, 4, 5]]
    assert split_rows(tokens, 4, balance=False, multiple=2) == [[0, 1], [2, 3], [4, 5], []]
    assert split_rows([3], 2, balance=True) == [[0], []]  # rank 0 always holds a row


def test_checkpoint_metadata_cannot_run_code(tmp_path):
    from trinity.trainer.sharded_checkpoint import _MetadataUnpickler

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="is not part of checkpoint metadata"):
        _MetadataUnpickler(__import__("io").BytesIO(pickle.dumps(Exploit()))).load()


def _masked_step_rank(rank: int, world: int, port: int, config_path: str, out: str) -> None:
    """One rank of an M2PO or Clip_B step: its token mask comes from the whole batch (M2PO's
    from the logprobs, Clip_B's from the policy's logprobs and entropies), gathered across
    ranks."""
    from trinity.common.config import load_config
    from trinity.trainer.distributed import close_group, init_group
    from trinity.trainer.sharded import ShardedTrainer

    torch.set_num_threads(1)
    ranks = init_group(rank, world, port, timeout_s=300)
    trainer = ShardedTrainer(
        finalize(load_config(config_path)), 4, log=lambda metrics, step: None, ranks=ranks
    )
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    trainer.step = 1
    metrics = trainer.train_step(experiences(trainer.tokenizer))
    grads = _grads(trainer.model)
    if rank == 0:
        save_file(grads, os.path.join(out, "grads.safetensors"))
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(metrics, f)
    close_group()


@pytest.mark.parametrize(
    "algorithm, masked",
    [
        ("algorithm_type: m2po", "actor/m2po_masked_frac"),
        (
            "algorithm_type: grpo, advantage_fn: clipb, advantage_fn_args: {mu: 0.0}",
            "clipb/frac_clipped",
        ),
    ],
)
def test_masked_two_ranks_step_equals_the_one_rank_step(
    tmp_path, micro_model, arithmetic_data, algorithm, masked
):
    import torch.multiprocessing as mp

    from trinity.common.config import load_config
    from trinity.trainer.distributed import free_port
    from trinity.trainer.trainer import Trainer

    def config(root: str, ranks: int) -> str:
        path = write_config(root, micro_model, arithmetic_data["rl"], ranks)
        with open(path) as f:
            text = f.read().replace("algorithm_type: grpo", algorithm)
        with open(path, "w") as f:
            f.write(text)
        return path

    two = str(tmp_path / "two")
    mp.spawn(_masked_step_rank, args=(2, free_port(), config(two, 2), two), nprocs=2)
    with open(os.path.join(two, "result.json")) as f:
        two_metrics = json.load(f)
    trainer = Trainer(
        finalize(load_config(config(str(tmp_path / "one"), 1))), 4, log=lambda m, s: None
    )
    trainer.prepare_model()
    trainer.attach_reader(reader=None)
    trainer.step = 1
    one_metrics = trainer.train_step(experiences(trainer.tokenizer))
    assert 0 < one_metrics[masked] < 1
    for key in (masked, "actor/pg_loss", "actor/grad_norm"):
        assert two_metrics[key] == pytest.approx(one_metrics[key], abs=1e-5), key
    _assert_close(load_file(os.path.join(two, "grads.safetensors")), _grads(trainer.model))
