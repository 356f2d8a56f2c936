"""Database URLs for `sql` storages and queue backups: normalising, masking, connecting.

A storage ``path`` is a SQLite file path or any SQLAlchemy URL (``sqlite:///x.db``,
``postgresql+psycopg://user:password@host/db``). Every message shows the URL with its
password replaced by ``***``. Kept free of other ``trinity`` imports: the config checks use
it before anything else is loaded, so SQLAlchemy (a quarter second to import) is imported
only where a URL is parsed or a database opened: a run without one never loads it.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    import sqlalchemy as sa

# Seconds a connection attempt (and, for SQLite, a wait for another writer's lock) may take.
CONNECT_TIMEOUT_S = 10.0
LOCK_TIMEOUT_S = 60.0
# Dialects whose DBAPI drivers take ``connect_timeout`` (seconds) as a connect argument.
_CONNECT_TIMEOUT_DIALECTS = ("postgresql", "mysql", "mariadb")
# The extra that installs a dialect's usual driver, for "driver not installed" messages.
_DRIVER_HINTS = {
    "postgresql": "pip install 'trinity-rft[postgres]' (psycopg), and use postgresql+psycopg://",
    "mysql": "pip install pymysql, and use mysql+pymysql://",
}


class DatabaseError(RuntimeError):
    """A database that cannot be used; the message names its URL (password masked)."""


def masked_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (``postgresql://u:***@host/db``)."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a file path."""
    return "://" in path


def database_url(path: str) -> str:
    """The SQLAlchemy URL ``path`` means: a file path or ``sqlite:///`` URL becomes an absolute
    ``sqlite:///`` URL (another process, such as a Ray actor, may have another working
    directory); any other URL is returned as written once SQLAlchemy can parse it."""
    if not is_url(path):
        return f"sqlite:///{os.path.abspath(os.path.expanduser(path))}"
    import sqlalchemy as sa

    try:
        url = sa.make_url(path)
    except (sa.exc.ArgumentError, ValueError) as exc:  # ValueError: e.g. a port not a number
        raise ValueError(f"'{masked_url(path)}' is not a database URL: {exc}") from None
    if url.get_backend_name() != "sqlite":
        return path
    if not url.database or url.database == ":memory:":
        raise ValueError(
            f"'{path}' is an in-memory SQLite database, private to one process and lost at "
            "exit; name a file: sqlite:///path/to/buffer.db"
        )
    return f"sqlite:///{os.path.abspath(os.path.expanduser(url.database))}"


def sqlite_file(url: str) -> Optional[str]:
    """The file of a ``sqlite:///`` URL, None for other databases."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    return parsed.database if parsed.get_backend_name() == "sqlite" else None


def create_engine(url: str, connect_timeout: float = CONNECT_TIMEOUT_S) -> sa.Engine:
    """An engine for ``url`` (from ``database_url``): a SQLite file's folder is created and
    writers wait up to ``LOCK_TIMEOUT_S`` for another's lock; a server connection gives up
    after ``connect_timeout`` seconds. Raises ``DatabaseError`` when the driver is missing."""
    import sqlalchemy as sa

    backend = sa.make_url(url).get_backend_name()
    connect_args: Dict[str, Any] = {}
    if backend == "sqlite":
        os.makedirs(os.path.dirname(sqlite_file(url)), exist_ok=True)
        connect_args = {"check_same_thread": False, "timeout": LOCK_TIMEOUT_S}
    elif backend in _CONNECT_TIMEOUT_DIALECTS:
        connect_args = {"connect_timeout": max(1, round(connect_timeout))}
    try:
        return sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        hint = _DRIVER_HINTS.get(backend, "install the SQLAlchemy driver it names")
        raise DatabaseError(
            f"database {masked_url(url)}: its driver is not installed ({exc}); {hint}"
        ) from None


def error_text(exc: BaseException) -> str:
    """The driver's own first line for a database error (SQLAlchemy's repeat the statement
    and its parameters, which may be large and hold data)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connection_problem(url: str, timeout: float = 5.0) -> Optional[str]:
    """Why ``url`` cannot be connected to within ``timeout`` seconds, or None when it can.
    A SQLite file is not created here: its folder's writability is checked elsewhere."""
    import sqlalchemy as sa

    file = sqlite_file(url)
    if file is not None and not os.path.exists(file):
        return None
    try:
        engine = create_engine(url, connect_timeout=timeout)
    except DatabaseError as exc:
        return str(exc)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        return f"cannot connect to database {masked_url(url)}: {error_text(exc)}"
    finally:
        engine.dispose()
    return None
