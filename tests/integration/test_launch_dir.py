"""A config's relative paths resolve against the folder `trinity run` started in, in every Ray
actor of the run too (``roles.LAUNCH_DIR_ENV``): a Ray worker starts in the folder Ray was
started from, which is another one here (the session's Ray started in the repository)."""

import os

import pytest

from trinity.runtime.roles import launch_env, setup_process


@pytest.fixture
def where(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Where:
        def __init__(self, job_dir: str) -> None:
            setup_process([], job_dir, "where")

        def cwd(self) -> str:
            return os.getcwd()

    return Where


def test_an_actor_works_in_the_launchers_folder(tmp_path, monkeypatch, where):
    import ray

    launched = tmp_path / "launched here"
    launched.mkdir()
    monkeypatch.chdir(launched)
    plain = where.remote(str(tmp_path / "job"))
    assert ray.get(plain.cwd.remote()) != str(launched)  # what Ray gives a worker
    placed = where.options(runtime_env={"env_vars": launch_env()}).remote(str(tmp_path / "job"))
    assert ray.get(placed.cwd.remote()) == str(launched)
    # an actor it starts passes the same folder on
    monkeypatch.setenv("TRINITY_LAUNCH_DIR", str(launched))
    monkeypatch.chdir(tmp_path)
    assert launch_env()["TRINITY_LAUNCH_DIR"] == str(launched)
