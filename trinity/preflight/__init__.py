"""What a run's config means and whether it can run, checked before anything starts
(docs/design-notes.md, "Principles" and "Checks before start").

These checks read the registries and code of every package below them (algorithm defaults,
engine names, buffer readers and components, monitors, the checkpoint layout), so they sit
above those packages; ``trinity.common.config`` keeps the schema, the loader and the checks
that need the config alone.

- ``derive``: ``finalize(config)`` (``derive`` without raising): every derived value, the
  support table, the consistency checks; what ``trinity run`` saves as ``config.yaml``.
- ``support``: the tables ``unsupported`` and ``validate`` check (``SUPPORTED``: "not
  supported yet" in one place, for the names ``DOCUMENTED`` lists; other names are
  "unknown", with the closest; ``SAMPLING``). A single value's bounds are on its field
  (``Field(ge=...)``).
- ``unsupported``: a line per value outside ``SUPPORTED``, and a supported value in its place
  so the other checks still run (their lines about it are dropped).
- ``validate``: checks that need the whole config (and ``ranks``: ``trainer.cpu_ranks``).
- ``before_start``: ``check_before_start(root)``, every stage's hub ids resolved to local
  folders (``hub_ids``), the stage finalized and then checked against the filesystem and the
  registries (model folders with ``model_folders``, data, components with ``components``,
  pipelines with ``operators``, ``monitor_checks``, ``bench_checks``), all problems in one
  ``ConfigError`` with those the schema found (``read_config``; those about paths in a
  missing ``${oc.env:VAR,default}`` folder folded into one by ``env_folders``); ``trinity
  run`` calls it before Ray starts.
- ``hosting``: whether a stage runs in the launcher's process or on Ray.

Extending: a check of a new key goes where its kind is (a value range: a ``support`` table;
a rule between keys: ``validate``; something on disk or a registry's component:
``before_start`` or a ``*_checks`` module it calls). Each check returns its problems as lines
naming the full YAML path, never raises; the caller reports them together.
"""
