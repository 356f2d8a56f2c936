"""``monitor`` checks before Ray starts: the sink's package is installed, its arguments are
ones it takes, W&B has an API key (or runs offline), and MLflow's tracking URI is one the
installed MLflow opens (a server that answers, or a store it still accepts).

Only what is known without a network call is checked: that a W&B key exists, not that it is
valid; that an MLflow server answers, not that it accepts the credentials.
"""

from __future__ import annotations

import importlib.util
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional

from trinity.monitor import MONITORS
from trinity.monitor.mlflow import DEFAULT_URI
from trinity.preflight.components import bind_problems

# monitor_type -> (the package it imports, the extra that installs it)
EXTRAS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
# What the Monitor passes every sink (monitor.py: MetricSink).
SINK_PARAMETERS = ("job_dir", "project", "run_name", "keep_until")
# How long preflight waits for the MLflow server's /health answer.
HEALTH_TIMEOUT_S = 5.0
# W&B modes that log without an account (wandb.init asks for no key in them).
WANDB_KEYLESS_MODES = ("offline", "dryrun", "disabled")


def monitor_problems(config: Any) -> List[str]:
    monitor = config.monitor
    kind, args = monitor.monitor_type, monitor.monitor_args or {}
    if kind in EXTRAS and importlib.util.find_spec(EXTRAS[kind][0]) is None:
        package, extra = EXTRAS[kind]
        return [
            f"monitor.monitor_type = {kind}: the {package} package is not installed; "
            f"pip install 'trinity-rft[{extra}]'"
        ]
    problems = bind_problems(
        MONITORS.get(kind), args, "monitor.monitor_args", f"monitor '{kind}'", SINK_PARAMETERS
    )
    if kind == "mlflow" and not problems:
        uri = str(args.get("uri", DEFAULT_URI))
        problems += _mlflow_store_problems(uri) or _mlflow_server_problems(uri)
    if kind == "wandb" and not problems:
        problems += _wandb_key_problems(args)
    return problems


def _mlflow_server_problems(uri: str) -> List[str]:
    """An http(s) tracking URI must answer; other URIs (sqlite:, databricks) are stores
    MLflow opens itself."""
    if not uri.startswith(("http://", "https://")):
        return []
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return []  # something answers (a proxy asking for credentials, say): MLflow decides
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return [
            f"monitor.monitor_args.uri = {uri}: no MLflow tracking server answers ({reason}); "
            "start one (mlflow server --host 127.0.0.1 --port 5000) or set the uri"
        ]
    return []


def _mlflow_store_problems(uri: str) -> List[str]:
    """A ``file:`` URI or a plain path is MLflow's filesystem store, which MLflow 3 refuses
    (an ``MlflowException`` in each role, after Ray started) unless ``MLFLOW_ALLOW_FILE_STORE``
    is true. Versions without that switch (MLflow 2) still open file stores."""
    if urllib.parse.urlparse(uri).scheme not in ("", "file"):
        return []
    from mlflow import environment_variables  # imported only for a file store: ~1 s

    allow = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allow is None or allow.get():
        return []
    from mlflow import __version__

    path = uri[len("file://") :] if uri.startswith("file://") else uri
    database = os.path.join(os.path.dirname(os.path.abspath(path)) or ".", "mlflow.db")
    return [
        f"monitor.monitor_args.uri = {uri}: MLflow {__version__} refuses file stores (file: "
        "URIs and plain paths); set monitor.monitor_args.uri to a database, e.g. "
        f"sqlite:///{database}, or to a tracking server (http://host:5000), or export "
        "MLFLOW_ALLOW_FILE_STORE=true to keep the file store"
    ]


def _wandb_key_problems(args: Dict[str, Any]) -> List[str]:
    """``wandb.init`` in each role fails (``UsageError: No API key configured``) when it runs
    online and finds no key: not in ``monitor_args``, the environment, wandb's settings
    files, nor ``~/.netrc`` (where ``wandb login`` writes it) for the server's host."""
    if args.get("api_key"):
        return []
    settings = _wandb_settings()
    if settings is None or settings.mode in WANDB_KEYLESS_MODES:
        return []
    if settings.api_key or settings.identity_token_file:
        return []
    host = str(args.get("base_url") or settings.base_url)
    try:
        from wandb.sdk.lib.wbauth import read_netrc_auth

        if read_netrc_auth(host=host):
            return []
    except ImportError:  # another wandb layout: it decides when the run starts
        return []
    except Exception as exc:  # a netrc entry wandb cannot use (its AuthenticationError)
        return [f"monitor.monitor_type = wandb: the W&B key in ~/.netrc for {host}: {exc}"]
    return [
        f"monitor.monitor_type = wandb: no W&B API key for {host} (WANDB_API_KEY is unset, "
        "monitor.monitor_args.api_key too, and `wandb login` saved none); export "
        "WANDB_API_KEY=<your key> (or run `wandb login`), or log offline with "
        "WANDB_MODE=offline and upload later with `wandb sync`"
    ]


def _wandb_settings() -> Optional[Any]:
    """wandb's settings as ``wandb.init`` reads them (its settings file, then ``WANDB_*``
    variables; ``wandb_setup._load_settings``), built here without wandb's process-wide
    singleton, which would keep this moment's environment for every later run in this
    process. None when this wandb's settings cannot be read so."""
    try:
        import wandb

        settings = wandb.Settings(quiet=True)  # no "Loading settings from" line here
        config_dir = os.environ.get("WANDB_CONFIG_DIR") or os.path.join("~", ".config", "wandb")
        settings.settings_system = os.path.join(os.path.expanduser(config_dir), "settings")
        settings.update_from_system_settings()
        settings.update_from_env_vars(dict(os.environ))
        return settings
    except Exception:  # an unexpected wandb version or setting: wandb reports it at start
        return None
