"""Drop-in modules: every ``*.py`` file in this folder (and in each ``--plugin-dir``) is
imported at start-up, in every process of a run, so the workflows, reward functions and
algorithm components it registers can be named in a config. What can be registered, with
an example of each: docs/extending.md.
"""
