import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_tensors

from trinity.buffer.codec import FORMAT, decode_experience, encode_experience
from trinity.common.experience import Experience

TENSORS = ("tokens", "logprobs", "action_mask", "advantages", "returns")


def _full() -> Experience:
    exp = Experience(
        tokens=[11, 12, 13, 14, 15],
        prompt_length=2,
        reward=0.75,
        logprobs=[-0.5, -1.25, -2.0],
        action_mask=[1, 0, 1],
        info={"finish_reason": "stop", "scores": [1, 2.5], "nested": {"ok": True, "x": None}},
        metrics={"acc": 1.0},
        group_id="task-3",
        model_version=7,
        prompt_text="2+2=",
        response_text="4",
        turn_starts=[0, 2],
        turn_states=["0-14 with 4 left", "8-14 with 3 left"],
    )
    exp.advantages = torch.tensor([0.1, -0.2, 0.3])
    exp.returns = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    return exp


def _assert_same(a: Experience, b: Experience) -> None:
    assert set(vars(a)) == set(vars(b))
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor) and other.dtype == value.dtype, name
            assert other.shape == value.shape, name
            # bit-exact: compare the raw bytes, so -0.0 vs 0.0 or NaN payloads would show
            assert value.view(torch.uint8).tolist() == other.view(torch.uint8).tolist(), name
        else:
            assert other == value, name


def test_round_trip_keeps_every_field():
    exp = _full()
    copy = decode_experience(encode_experience(exp))
    _assert_same(exp, copy)
    assert copy.eid == exp.eid and copy.response_length == 3
    assert copy.action_mask.tolist() == [True, False, True]


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32]
)
def test_round_trip_is_bit_exact_per_dtype(dtype):
    exp = Experience(tokens=[1, 2, 3, 4], prompt_length=1)
    values = torch.tensor([-0.0, 1.0 / 3.0, -7.125])
    exp.logprobs = values.to(dtype)  # set after __init__, which would make it float32
    exp.advantages = values.to(dtype)
    copy = decode_experience(encode_experience(exp))
    _assert_same(exp, copy)
    assert copy.logprobs.dtype == dtype


def test_bf16_bits_survive():
    # a normal number, a subnormal, +inf, a NaN with a payload, -0.0
    bits = [0x3F81, 0x0001, 0x7F80, 0x7FC1, -0x8000]
    exp = Experience(tokens=[1, 2, 3, 4, 5, 6], prompt_length=1)
    exp.advantages = torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)
    copy = decode_experience(encode_experience(exp))
    assert copy.advantages.dtype == torch.bfloat16
    assert copy.advantages.view(torch.int16).tolist() == bits


def test_empty_response_and_missing_optional_tensors():
    exp = Experience(tokens=[4, 5], prompt_length=2)  # no response, no logprobs
    copy = decode_experience(encode_experience(exp))
    _assert_same(exp, copy)
    assert copy.response_length == 0 and copy.logprobs is None
    assert copy.action_mask.shape == (0,) and copy.action_mask.dtype == torch.bool
    # several empty tensors at once (empty storages must not count as shared memory)
    exp = Experience(tokens=[4, 5], prompt_length=2, logprobs=[])
    exp.advantages, exp.returns = torch.zeros(0), torch.zeros(0, dtype=torch.bfloat16)
    _assert_same(exp, decode_experience(encode_experience(exp)))


def test_views_store_their_values_only_and_shared_tensors_are_split():
    batch_adv = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    exp = Experience(tokens=[1, 2, 3, 4], prompt_length=1)
    exp.advantages = batch_adv[2]  # a row view of a (4, 3) batch tensor
    exp.returns = exp.advantages  # the same tensor twice (as GRPO-style code may leave it)
    data = encode_experience(exp)
    small = encode_experience(Experience(tokens=[1, 2, 3, 4], prompt_length=1))
    # two 3-float tensors more than an experience without them, not the whole batch
    assert len(data) - len(small) < 2 * 3 * 4 + 200
    copy = decode_experience(data)
    assert copy.advantages.tolist() == [6.0, 7.0, 8.0] == copy.returns.tolist()
    copy.advantages[0] = -1.0  # decoded tensors are owned and independent
    assert copy.returns[0] == 6.0 and batch_adv[2, 0] == 6.0


def test_numpy_and_torch_values_in_info_become_json():
    exp = Experience(tokens=[1, 2], prompt_length=1)
    exp.info = {
        "np_float": np.float32(1.5),
        "np_bool": np.bool_(True),
        "scalar": torch.tensor(3),
        "ids": torch.tensor([7, 8]),
        "grid": np.array([[1, 2], [3, 4]]),
        "pair": (1, "a"),
    }
    copy = decode_experience(encode_experience(exp))
    assert copy.info == {
        "np_float": 1.5,
        "np_bool": True,
        "scalar": 3,
        "ids": [7, 8],
        "grid": [[1, 2], [3, 4]],
        "pair": [1, "a"],
    }


class Foo:
    pass


def test_non_json_info_value_names_the_key():
    exp = Experience(tokens=[1, 2], prompt_length=1, info={"x": Foo()})
    with pytest.raises(TypeError, match=r"Experience\.info\['x'\] holds a Foo; store numbers"):
        encode_experience(exp)
    exp = Experience(tokens=[1, 2], prompt_length=1, metrics={"m": [1, {"deep": {1, 2}}]})
    with pytest.raises(TypeError, match=r"Experience\.metrics\['m'\]\[1\]\['deep'\] holds a set"):
        encode_experience(exp)
    exp = Experience(tokens=[1, 2], prompt_length=1, info={3: "int key"})
    with pytest.raises(TypeError, match=r"Experience\.info has the key 3 \(int\)"):
        encode_experience(exp)


class _Boom:
    """Unpickling this would create a file: proof that code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_blob_is_rejected_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    blob = pickle.dumps(_Boom(str(marker)))
    with pytest.raises(ValueError, match="not an encoded Experience"):
        decode_experience(blob)
    assert not marker.exists()
    # the same payload inside a valid safetensors header's metadata is still only a string
    fake = save_tensors(
        {"tokens": torch.tensor([1, 2])},
        metadata={"format": FORMAT, "fields": blob.hex()},
    )
    with pytest.raises(ValueError, match="fields are not JSON"):
        decode_experience(fake)
    assert not os.path.exists(marker)


@pytest.mark.parametrize(
    "tensors, fields, message",
    [
        ({"tokens": torch.tensor([1, 2])}, '{"prompt_length": 5}', "exceeds 2 tokens"),
        ({"tokens": torch.tensor([1.0, 2.0])}, '{"prompt_length": 1}', "integer tokens"),
        (
            {"tokens": torch.tensor([1, 2, 3]), "logprobs": torch.zeros(5)},
            '{"prompt_length": 1}',
            "logprobs has 5 entries, expected 2",
        ),
        ({"tokens": torch.tensor([1, 2])}, '{"prompt_length": 1, "info": []}', "info is not"),
        ({"tokens": torch.tensor([1, 2])}, '{"prompt_length": 1, "__class__": 1}', "names"),
        ({"tokens": torch.tensor([1, 2])}, "[1, 2]", "not a JSON object"),
    ],
)
def test_inconsistent_blobs_are_rejected(tensors, fields, message):
    blob = save_tensors(tensors, metadata={"format": FORMAT, "fields": fields})
    with pytest.raises(ValueError, match=message):
        decode_experience(blob)


def test_other_safetensors_and_garbage_are_rejected():
    other = save_tensors({"weight": torch.zeros(2)}, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="format 'pt'"):
        decode_experience(other)
    for junk in (b"", b"\x00" * 3, b"PK\x03\x04zipfile"):
        with pytest.raises(ValueError, match="not an encoded Experience"):
            decode_experience(junk)


def test_fields_missing_from_an_older_row_take_their_defaults():
    blob = save_tensors(
        {"tokens": torch.tensor([1, 2, 3])},
        metadata={"format": FORMAT, "fields": '{"prompt_length": 1, "reward": 1.0}'},
    )
    exp = decode_experience(blob)
    assert exp.reward == 1.0 and exp.info == {} and exp.metrics == {} and exp.group_id == ""
    assert exp.logprobs is None and exp.model_version == 0 and len(exp.eid) == 32
    assert exp.action_mask.tolist() == [True, True]


def test_the_bytes_are_those_safetensors_torch_save_writes():
    """Encoding from the tensors' memory writes what the library's torch ``save`` writes
    for the same tensors and metadata (the same header, the same tensor bytes; the order of
    the metadata's keys varies between calls of either): a row stays a safetensors blob any
    tool reads."""
    import json
    import struct

    def parts(blob: bytes):
        (size,) = struct.unpack("<Q", blob[:8])
        return json.loads(blob[8 : 8 + size]), blob[8 + size :]

    exp = _full()
    batch = torch.arange(12, dtype=torch.bfloat16).reshape(4, 3)
    exp.advantages = batch[1]  # a view into a larger tensor, at an offset
    exp.action_mask = torch.tensor([True, False, True])
    exp.scratch = torch.empty(0)  # an empty tensor, under a name of its own
    exp.returns = None
    data = encode_experience(exp)
    tensors = {
        name: value.contiguous().clone()
        for name, value in vars(exp).items()
        if isinstance(value, torch.Tensor)
    }
    fields = {
        name: value for name, value in vars(exp).items() if not isinstance(value, torch.Tensor)
    }
    header = {"format": FORMAT, "fields": json.dumps(fields, allow_nan=True)}
    assert parts(data) == parts(save_tensors(tensors, metadata=header))
    assert decode_experience(data).advantages.tolist() == [3.0, 4.0, 5.0]
