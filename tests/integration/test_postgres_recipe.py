"""examples/decoupled/postgres.sh, the local PostgreSQL the docs point to, starts (also as
root), prints a URL the experience store connects to, starts again idempotently and stops."""

import os
import subprocess

import pytest

from tests.pg import _free_port, postgres_bin_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "decoupled", "postgres.sh")

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL not installed")


def run(*args, port):
    env = {**os.environ, "PGPORT": str(port)}
    done = subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_postgres_recipe_serves_the_experience_store(tmp_path_factory):
    import sqlalchemy as sa

    folder = os.path.join("/var/tmp", f"trinity-pg-{os.getpid()}")  # the server user reads it
    port = _free_port()
    try:
        line = run("start", folder, port=port)
        assert line.startswith("export TRINITY_BUFFER_URL=postgresql+psycopg://trinity:")
        url = line.split("=", 1)[1]
        assert run("start", folder, port=port) == line  # running already: same URL
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            who = conn.execute(sa.text("SELECT current_database(), current_user")).one()
        engine.dispose()
        assert tuple(who) == ("rl", "trinity")
    finally:
        run("stop", folder, port=port)
        subprocess.run(["rm", "-rf", folder], check=False)
