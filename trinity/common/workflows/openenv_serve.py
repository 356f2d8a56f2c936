"""The child process of ``openenv_env.LocalServer``: serves one app with uvicorn on 127.0.0.1.

    python .../openenv_serve.py package.module:app PORT PARENT_PID   (a script: no package import)

It exits when its parent does: a process ended without running its exit handlers (a Ray
actor killed) would otherwise leave the server behind, holding its port.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list) -> None:
    # A script's folder comes first on its import path; this one's has openenv.py, which
    # would hide the openenv package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import uvicorn

    app, port, parent = argv[0], int(argv[1]), int(argv[2])
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
