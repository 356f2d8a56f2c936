"""Helpers shared across the package that belong to no single component.

Add a module here only for code used by several components; component-specific helpers live
next to their component. This is the bottom layer: nothing here imports the rest of
``trinity``.
"""
