"""The ``trinity`` command line. Add a subcommand as a function decorated with ``@app.command()``
in ``main.py``; keep heavy imports inside the function so ``trinity --help`` stays fast. A
command's own code that is no component's (``debug.py``: ``trinity debug``; ``view.py``:
``trinity view``) is a module here, the top layer, free to use any package below."""
