"""The studio's form comes from the schema; its values round-trip to YAML `trinity run` reads."""

from __future__ import annotations

import json
import os
import types
import typing

from omegaconf import OmegaConf
from pydantic import BaseModel, Field

from trinity.common.config import Config, load_config
from trinity.common.config.base import ConfigModel, inert
from trinity.studio import checks
from trinity.studio.form import EXTRA, field_kind, form_definitions, parse_values

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart", "arithmetic.yaml")


def _all_models(model: type, seen: dict) -> dict:
    """The sections under ``model``: fields that are a model or a list of them (optional or
    not). A mapping of models (``reasoning_gym.datasets``) is one YAML field on the form."""
    seen[model.__name__] = model
    for field in model.model_fields.values():
        union = typing.get_origin(field.annotation) in (typing.Union, types.UnionType)
        for tp in typing.get_args(field.annotation) if union else (field.annotation,):
            inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                if inner.__name__ not in seen:
                    _all_models(inner, seen)
    return seen


def test_every_section_and_field_of_the_schema_is_on_the_form():
    defs = form_definitions()["defs"]
    models = _all_models(Config, {})
    assert set(defs) == set(models)
    for name, model in models.items():
        fields = {spec["key"]: spec for spec in defs[name]["fields"]}
        assert list(fields) == list(model.model_fields)
        for key, field in model.model_fields.items():
            assert fields[key]["doc"] == field.description, f"{name}.{key}"


def test_field_kinds_defaults_choices_and_inert_reasons_come_from_the_schema():
    fields = {s["key"]: s for s in form_definitions()["defs"]["Config"]["fields"]}
    assert fields["mode"]["kind"] == "choice"
    assert fields["mode"]["choices"] == [
        '"both"',
        '"train"',
        '"explore"',
        '"bench"',
        '"colocate"',
        '"serve"',
    ]
    assert fields["mode"]["default"] == '"both"'
    assert fields["ignore_validator_suggestions"]["inert"].startswith(
        "the checks before start make"
    )
    assert fields["continue_from_checkpoint"] == {
        **fields["continue_from_checkpoint"],
        "kind": "bool",
        "default": "true",
    }
    assert fields["buffer"] == {**fields["buffer"], "kind": "section", "model": "BufferConfig"}
    assert fields["stages"]["kind"] == "list"
    optimizer = {s["key"]: s for s in form_definitions()["defs"]["OptimizerConfig"]["fields"]}
    assert optimizer["lr"] == {**optimizer["lr"], "kind": "number", "default": "1.0e-06"}
    assert optimizer["betas"] == {**optimizer["betas"], "kind": "yaml", "default": "[0.9, 0.999]"}
    correction = form_definitions()["defs"]["RolloutCorrectionConfig"]["fields"]
    rollout_is = {s["key"]: s for s in correction}["rollout_is"]
    assert rollout_is["choices"] == ['"token"', '"sequence"', "null"]


def test_a_new_field_appears_without_touching_the_studio():
    class Section(ConfigModel):
        """A section."""

        depth: int = Field(3, description="How deep.")

    class Root(ConfigModel):
        """A root."""

        section: Section = Field(default_factory=Section, description="The section.")
        old: bool = inert(False, description="Old key.", reason="use section.depth")

    defs = form_definitions(Root)["defs"]
    assert defs["Section"]["fields"] == [
        {
            "key": "depth",
            "doc": "How deep.",
            "kind": "number",
            "type": "int",
            "nullable": False,
            "default": "3",
        }
    ]
    assert defs["Root"]["fields"][1]["inert"] == "use section.depth"


def test_parse_keeps_only_set_values_in_schema_order_and_types_them():
    raw = {
        "buffer": {"batch_size": "8", "explorer_input": {"tasksets": [{"path": "/d", "name": ""}]}},
        "algorithm": {"optimizer": {"lr": "3e-5", "betas": "[0.8, 0.9]"}, "repeat_times": ""},
        "mode": '"train"',
        "model": {},
        "continue_from_checkpoint": False,
    }
    data, problems = parse_values(Config, raw)
    assert problems == []
    assert list(data) == ["mode", "continue_from_checkpoint", "algorithm", "buffer"]
    assert data["algorithm"] == {"optimizer": {"lr": 3e-05, "betas": [0.8, 0.9]}}
    assert data["buffer"] == {"batch_size": 8, "explorer_input": {"tasksets": [{"path": "/d"}]}}


def test_a_value_that_does_not_parse_is_named_by_its_path():
    raw = {"algorithm": {"optimizer": {"betas": "[0.9, "}}}
    _, problems = parse_values(Config, raw)
    assert len(problems) == 1
    assert problems[0].startswith("algorithm.optimizer.betas: not valid YAML")


def test_loaded_file_saves_unchanged_and_loads_the_same(tmp_path):
    raw = checks.load(QUICKSTART)
    assert "taskset:" in raw["buffer"]["explorer_input"][EXTRA]  # an alias, kept as written
    saved = checks.save(raw, str(tmp_path / "out.yaml"))
    # As `trinity run` reads YAML (OmegaConf reads 3e-5 as a number, PyYAML as a string).
    original = OmegaConf.to_container(OmegaConf.load(QUICKSTART))
    assert OmegaConf.to_container(OmegaConf.load(saved)) == original
    assert load_config(saved).model_dump() == load_config(QUICKSTART).model_dump()


def _grpo(model: str, data: str, batch_size: str) -> dict:
    return {
        "algorithm": {"algorithm_type": "grpo", "repeat_times": "4"},
        "model": {"model_path": model, "max_prompt_tokens": "32", "max_response_tokens": "8"},
        "buffer": {
            "batch_size": batch_size,
            "total_steps": "2",
            "explorer_input": {
                "default_workflow_type": "math_workflow",
                "tasksets": [
                    {
                        "name": "train",
                        "path": data,
                        "split": "train",
                        "format": {"prompt_key": "question", "response_key": "answer"},
                    }
                ],
            },
        },
        "checkpoint_root_dir": "/tmp/trinity-studio-test",
    }


def test_check_lists_problems_and_derived_values_like_trinity_run(
    micro_model, arithmetic_data, tmp_path
):
    good = checks.check(_grpo(micro_model, arithmetic_data["rl"], "8"))
    assert good["problems"] == []
    derived = dict(good["derived"]["main"])
    assert derived["buffer.train_batch_size"] == 32  # batch_size 8 x repeat_times 4
    assert derived["ray_namespace"] == "Trinity-RFT/rft"
    assert derived["model.max_model_len"] == 40  # 32 prompt + 8 response tokens

    bad = checks.check(_grpo(micro_model, arithmetic_data["rl"], "0"))
    assert any(p.startswith("buffer.batch_size") for p in bad["problems"])
    typo = checks.check(_grpo(micro_model, arithmetic_data["rl"], "eight"))
    assert len(typo["problems"]) == 1 and typo["problems"][0].startswith("buffer.batch_size:")

    path = checks.save(_grpo(micro_model, arithmetic_data["rl"], "8"), str(tmp_path / "g.yaml"))
    assert load_config(path).buffer.batch_size == 8


def test_the_form_comes_with_the_opening_configs_values_and_check(
    micro_model, arithmetic_data, tmp_path
):
    """The page's first paint shows the check's result: it comes with the form, computed
    once before the server listens (the first check imports torch and transformers)."""
    from fastapi.testclient import TestClient

    from trinity.studio.app import create_app

    raw = _grpo(micro_model, arithmetic_data["rl"], "8")
    raw["checkpoint_root_dir"] = str(tmp_path / "ck")
    path = checks.save(raw, str(tmp_path / "g.yaml"))
    opening = TestClient(create_app(path)).get("/api/form").json()["opening"]
    assert opening["values"] == checks.load(path) and opening["load_problems"] == []
    assert opening["check"]["problems"] == []
    assert dict(opening["check"]["derived"]["main"])["buffer.train_batch_size"] == 32

    missing = str(tmp_path / "missing.yaml")
    opening = TestClient(create_app(missing)).get("/api/form").json()["opening"]
    assert opening["load_problems"] == [f"config file not found: {missing}"]
    assert opening["values"] == {} and opening["check"]["problems"]  # the defaults' problems
    defaults = TestClient(create_app()).get("/api/form").json()
    assert defaults["path"] == "" and defaults["opening"]["values"] == {}


def test_a_busy_port_is_named_before_anything_starts(monkeypatch):
    import socket

    from typer.testing import CliRunner

    import trinity.studio
    from trinity.cli.main import app

    def served(*args, **kwargs):
        raise AssertionError("the studio started on a busy port")

    monkeypatch.setattr(trinity.studio, "serve", served)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["studio", "--port", str(port)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"error: port {port} is in use on 127.0.0.1; pass --port with a free port" in message


def _data_at(pattern: str, value, done: tuple = ()):
    """Config data with ``value`` at ``pattern``: one item (a list's or a mapping's) per ``*``."""
    import typing

    from trinity.common.config.base import _annotation_at, _unwrap

    head, _, rest = pattern.partition(".")
    if not rest:
        return {head: value}
    if rest.startswith("*."):
        mapping = typing.get_origin(_unwrap(_annotation_at(Config, (*done, head)))) is dict
        item = _data_at(rest[2:], value, (*done, head, "x" if mapping else 0))
        return {head: {"x": item} if mapping else [item]}
    return {head: _data_at(rest, value, (*done, head))}


def _choices_of(pattern: str):
    """The choices the studio's input offers for ``pattern`` (None for a free input)."""
    from trinity.common.config.base import _annotation_at

    loc = tuple(0 if part == "*" else part for part in pattern.split("."))
    spec = field_kind(_annotation_at(Config, loc))
    if spec["kind"] == "bool":
        return [True, False]
    return [json.loads(c) for c in spec["choices"]] if spec["kind"] == "choice" else None


def test_the_studio_offers_exactly_the_choices_the_checks_run():
    """Every choice field with a "not supported yet" rule: a value is offered (enabled) on
    the page if and only if the checks accept it in some mode."""
    from trinity.common.config.base import validate_model
    from trinity.preflight.support import SUPPORTED
    from trinity.preflight.unsupported import check_supported

    supported = form_definitions()["supported"]
    walked, refused = 0, []
    for pattern in SUPPORTED:
        choices = _choices_of(pattern)
        if choices is None:
            continue
        concrete = pattern.split(".*.")[0]  # a problem of that key or an item of it
        for value in choices:
            modes = [value] if pattern == "mode" else SUPPORTED["mode"]
            runs = False
            for mode in modes:
                data = {**_data_at(pattern, value), **({} if pattern == "mode" else {"mode": mode})}
                problems = check_supported(validate_model(Config, data))
                runs = runs or not [p for p in problems if p.startswith(concrete)]
            assert (json.dumps(value) in supported[pattern]) == runs, (pattern, value)
            walked += 1
            refused += [] if runs else [f"{pattern}={value}"]
    assert walked >= 20  # mode, storage types, sync_method, replay, ... each value of each
    assert "trainer.trainer_strategy=megatron" in refused
    assert "synchronizer.sync_method=nccl" not in refused and "mode=serve" not in refused
