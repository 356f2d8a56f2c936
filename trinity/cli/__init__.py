"""The ``trinity`` command line. Add a subcommand as a function decorated with ``@app.command()``
in ``main.py``; keep heavy imports inside the function so ``trinity --help`` stays fast."""
