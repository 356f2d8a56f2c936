"""Helpers shared across the package that belong to no single component.

``synthetic`` generates seeded, verifiable datasets (arithmetic, countdown) and the
quickstart bundle (tiny model + data). Add a module here only for code used by several
components; component-specific helpers live next to their component.
"""
