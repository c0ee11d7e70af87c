"""Griffe extension for the API reference (loaded by mkdocstrings, see mkdocs.yml): hide private parameters.

A keyword-only parameter whose name starts with an underscore (``join(..., _settings=None)``: test-only
settings) is an implementation detail, not part of the API: it is dropped from the signature griffe
reads, so the rendered page does not show it. The source is unchanged; ``help()`` still shows it.
"""

from __future__ import annotations

from typing import Any

import griffe


class HidePrivateParameters(griffe.Extension):
    """Drop keyword-only ``_name`` parameters from documented signatures."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for param in list(func.parameters):
            if param.name.startswith("_") and param.kind is griffe.ParameterKind.keyword_only:
                del func.parameters[param.name]
