"""Griffe extension for the API reference (loaded by mkdocstrings, see mkdocs.yml).

Two fixes, applied to the docstrings and signatures griffe reads from the source (statically: the package
need not be importable to build the docs):

* Sphinx roles that some docstrings still use (``:class:`~syncreward.Backend```, ``:func:`join```,
  ``:meth:`leave```) become mkdocstrings cross-references (``[Backend][syncreward.Backend]``) when the
  target is rendered on the API page, and inline code otherwise. New docstrings should use the
  cross-reference syntax directly.
* A parameter default that names a module constant with a literal value (``timeout=DEFAULT_TIMEOUT``)
  shows the value (``1800.0``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|exc|data|obj|mod):`(~?)([\w.]+)`")
_API_PAGE = Path(__file__).resolve().parents[1] / "api.md"


def _documented() -> set[str]:
    """Identifiers rendered on the API page (``::: path`` lines)."""
    text = _API_PAGE.read_text(encoding="utf-8") if _API_PAGE.exists() else ""
    return set(re.findall(r"^:::\s*([\w.]+)", text, re.M))


class SyncrewardDocs(griffe.Extension):
    """Rewrite Sphinx roles into cross-references and show constant defaults by value."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        documented = _documented()
        # canonical path (where the object is defined) -> the path the API page renders it under
        public: dict[str, str] = {}
        for ident in sorted(documented, key=len, reverse=True):
            try:
                obj = loader.modules_collection[ident]
                public[obj.canonical_path] = ident
            except Exception:  # an identifier outside this package
                public[ident] = ident
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _ROLE.sub(
                    lambda m, scope=obj: _xref(m, scope, loader, public),
                    obj.docstring.value,
                )
            if isinstance(obj, griffe.Function):
                for fn in (obj, *(getattr(obj, "overloads", None) or ())):
                    _inline_constant_defaults(fn)


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found += _walk(member)  # type: ignore[arg-type]
    return found


def _resolve(name: str, scope: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
    try:
        return loader.modules_collection[name].canonical_path  # an absolute path
    except Exception:
        pass
    head, _, rest = name.partition(".")
    for candidate in (scope, scope.parent):
        if candidate is None:
            continue
        try:
            path = candidate.resolve(head)
            target = loader.modules_collection[path + ("." + rest if rest else "")]
            return target.canonical_path
        except Exception:
            continue
    return None


def _xref(match: re.Match[str], scope: griffe.Object, loader: griffe.GriffeLoader, public: dict[str, str]) -> str:
    short, name = match.group(1), match.group(2)
    title = name.rsplit(".", 1)[-1] if short else name
    canonical = _resolve(name, scope, loader)
    if canonical is not None:
        for rendered_canonical, rendered in public.items():
            if canonical == rendered_canonical or canonical.startswith(rendered_canonical + "."):
                return f"[`{title}`][{rendered + canonical[len(rendered_canonical) :]}]"
    return f"`{title}`"


def _inline_constant_defaults(fn: griffe.Function) -> None:
    for param in fn.parameters:
        default = param.default
        if isinstance(default, griffe.ExprName):
            try:
                target = fn.module[default.name]
            except Exception:
                continue
            value = getattr(target, "value", None)
            if isinstance(value, str) and re.fullmatch(r"-?[\d_.]+(e-?\d+)?|'[^']*'|\"[^\"]*\"|True|False|None", value):
                param.default = value
