"""The weight checksums of the vllm engine (trinity/engine/vllm_worker.py), on hand-made
tensors and worker reports: no vLLM needed."""

import torch

from trinity.engine.vllm_worker import mismatches, tensor_stats

BF16 = torch.bfloat16


def test_a_checksum_is_the_sum_of_the_stored_bit_patterns():
    # bf16 bit patterns: 1.0 = 0x3F80 = 16256, 2.0 = 0x4000 = 16384, -1.0 = 0xBF80 = -16512
    assert tensor_stats(torch.tensor([1.0, 2.0, -1.0], dtype=BF16)) == (16256 + 16384 - 16512, 3)
    # float32 1.0 = 0x3F800000 = 1065353216; +0.0 adds nothing (vLLM's vocabulary padding)
    assert tensor_stats(torch.tensor([[1.0, 0.0]])) == (1065353216, 2)
    # a change in the last bit of one value changes the sum
    a = torch.tensor([0.1, 0.2], dtype=BF16)
    b = a.clone()
    b.view(torch.int16)[1] += 1
    assert tensor_stats(a)[0] + 1 == tensor_stats(b)[0]


def stats(*values):
    return tensor_stats(torch.tensor(values, dtype=BF16))


PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
SENT = {
    "model.layers.0.self_attn.q_proj.weight": stats(1.0, 2.0),
    "model.layers.0.self_attn.k_proj.weight": stats(3.0),
    "model.layers.0.self_attn.v_proj.weight": stats(-1.0),
    "model.norm.weight": stats(1.0, 1.0),
    "model.embed_tokens.weight": stats(0.5, 0.25),
    "lm_head.weight": stats(0.5, 0.25),
}


def report(qkv=(1.0, 2.0, 3.0, -1.0), norm=(1.0, 1.0)):
    return {
        "stats": {
            "model.layers.0.self_attn.qkv_proj.weight": stats(*qkv),
            "model.norm.weight": stats(*norm),
            "model.embed_tokens.weight": stats(0.5, 0.25, 0.0, 0.0),  # padded vocabulary
        },
        "packed": PACKED,
    }


def test_an_engine_that_holds_the_sent_tensors_has_no_mismatch():
    # q, k and v are one fused parameter in vLLM; lm_head is the tied embedding
    assert mismatches(SENT, [report()], tied=True) == []


def test_a_fused_parameter_with_one_stale_part_names_every_part():
    wrong = mismatches(SENT, [report(qkv=(1.0, 2.0, 3.0, -2.0))], tied=True)
    assert wrong == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ]


def test_an_untied_lm_head_the_engine_lacks_is_named():
    assert mismatches(SENT, [report()], tied=False) == [
        "lm_head.weight (no such parameter in the engine)"
    ]


def test_tensor_parallel_ranks_hold_shards_or_replicas():
    # rank 0 holds q, rank 1 k and v; the norm and the embedding are on both ranks
    ranks = [report(qkv=(1.0, 2.0)), report(qkv=(3.0, -1.0))]
    assert mismatches(SENT, ranks, tied=True) == []
    stale = [report(qkv=(1.0, 2.0)), report(qkv=(3.0, -1.0), norm=(1.0, 2.0))]
    assert mismatches(SENT, stale, tied=True) == ["model.norm.weight"]
