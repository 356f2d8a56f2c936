"""A real PostgreSQL server for tests, started in a temporary folder from the system's binaries.

``PostgresServer`` runs ``initdb`` and ``pg_ctl`` from ``/usr/local/bin`` or
``/usr/lib/postgresql/<version>/bin`` (``apt-get install postgresql``; ``.ci/run`` installs it
when missing). PostgreSQL refuses to run as root, so under root the server runs as the
``postgres`` system user (created when missing). It listens on 127.0.0.1 only, on a free
port, with its socket in the temporary folder, and requires a password over TCP, so the
URLs the tests use carry one (and messages must mask it).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from typing import Optional

PASSWORD = "s3cret-pw"
USER = "trinity"


def postgres_bin_dir() -> Optional[str]:
    """The folder holding ``initdb`` and ``pg_ctl``, or None when PostgreSQL is not installed."""
    candidates = ["/usr/local/bin"] + sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.insert(0, os.path.dirname(on_path))
    for folder in candidates:
        if all(os.access(os.path.join(folder, b), os.X_OK) for b in ("initdb", "pg_ctl")):
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user() -> Optional[str]:
    """The user the server runs as: ``postgres`` under root (created if needed), else us."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    return "postgres"


class PostgresServer:
    """One server for a test session; ``new_database()`` gives each test a database of its own."""

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir, self.user = bin_dir, _server_user()
        # Not under pytest's tmp dir: its parents are private to root, the server is not root.
        self.root = tempfile.mkdtemp(prefix="trinity-pg-")
        self.data, self.port = os.path.join(self.root, "data"), _free_port()
        if self.user:
            info = pwd.getpwnam(self.user)
            os.chown(self.root, info.pw_uid, info.pw_gid)

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        cmd = prefix + [os.path.join(self.bin_dir, args[0]), *args[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr or done.stdout}")

    def start(self) -> PostgresServer:
        pwfile = os.path.join(self.root, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD)
        if self.user:
            shutil.chown(pwfile, self.user)
        self._run(
            "initdb", "-D", self.data, "-U", USER, f"--pwfile={pwfile}", "--auth-local=trust",
            "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-sync",
        )  # fmt: skip
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        log = os.path.join(self.root, "server.log")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "-t", "60", "start")
        return self

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql+psycopg://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import sqlalchemy as sa

        name = f"t_{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
