"""What ``help()`` shows is plain text: no mkdocs cross-reference syntax, no private parameters."""

from __future__ import annotations

import inspect
import pydoc

import pytest

import syncreward


def _help(obj: object) -> str:
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def test_help_backend_shows_no_mkdocs_syntax() -> None:
    text = _help(syncreward.Backend)
    assert "][syncreward." not in text, text
    assert "SyncTimeoutError" in text  # the words are still there


def test_help_join_hides_private_settings() -> None:
    pytest.importorskip("ray")
    from syncreward.backends.ray import join

    assert "_settings" not in str(inspect.signature(join))
    assert str(inspect.signature(join)).startswith("(group: 'str', rank: 'int', world_size: 'int', *, timeout")
    assert "_settings" not in _help(join)
    assert "_settings" in join.__code__.co_varnames  # the tests' knob still works
