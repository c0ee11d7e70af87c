"""The documentation site builds in strict mode (broken links and missing pages fail) and renders as intended."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def test_mkdocs_strict_build(site: Path) -> None:
    assert (site / "api" / "index.html").read_text().count("synced_reward") > 3


def test_api_reference_renders_cross_references_not_sphinx_roles(site: Path) -> None:
    html = (site / "api" / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", html)
    assert not re.search(r":(class|func|meth|attr|exc):", text), re.findall(r".{60}:(?:class|func|meth):.{60}", text)
    assert "DEFAULT_TIMEOUT" not in text  # the default is shown by value
    assert "1800" in text
    assert '"ray"' in text or "&quot;ray&quot;" in html
    assert 'href="#syncreward.Backend"' in html  # a cross-reference, not inline code
    assert "language-pycon" in html or 'class="highlight"' in html  # the docstring example renders as code


def test_code_is_highlighted_and_edit_links_point_at_main(site: Path) -> None:
    page = (site / "guides" / "torchrun" / "index.html").read_text()
    assert '<div class="highlight">' in page  # pymdownx.highlight (Pygments), no CDN script needed
    assert "/edit/main/docs/" in page
    assert "/edit/master/" not in page


def test_troubleshooting_errors_reach_the_sidebar(site: Path) -> None:
    page = (site / "troubleshooting" / "index.html").read_text()
    sidebar = page.split('id="toc-collapse"', 1)[1].split("</div>", 1)[0]
    assert sidebar.count('data-bs-level="3"') >= 10, sidebar[:2000]


def test_internals_are_a_contributors_page(site: Path) -> None:
    """The path of a call and the measurement notes live on Internals, linked under "For contributors"."""
    nav = (site / "index.html").read_text()
    assert "For contributors" in nav
    assert 'href="internals/"' in nav
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    assert "_lifecycle" not in concepts
    assert "eager chunk" not in concepts
    assert "## What makes two calls the same call" in concepts  # the user contract stays on Concepts
    performance = (ROOT / "docs" / "performance.md").read_text()
    assert not re.search(r"commit `[0-9a-f]{7}`|glibc|Firecracker", performance)


def test_collectives_per_call_are_counted_on_one_page() -> None:
    """Performance's table holds the counts; the pages that once repeated them (and drifted) link to it."""
    pages = ["README.md", "docs/index.md", "docs/quickstart.md", "docs/concepts.md", "docs/guides/trl.md"]
    for page in pages:
        text = (ROOT / page).read_text()
        assert not re.search(r"\b\d+ collectives?\b|\(\d+ on (its|the) first call", text), page
    assert "| … on a session's first calls, or with large inputs |" in (ROOT / "docs" / "performance.md").read_text()


def test_api_reference_hides_private_parameters(site: Path) -> None:
    """Ray ``join``'s test-only ``_settings`` keyword is not part of the documented signature."""
    text = re.sub(r"<[^>]+>", "", (site / "api" / "index.html").read_text())
    assert "join(group, rank, world_size, *, timeout=" in text
    assert "_settings" not in text


def test_docs_strict_build_fails_on_a_broken_anchor(tmp_path: Path) -> None:
    """A link to a heading that does not exist (a renamed troubleshooting entry) fails the strict build."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    import shutil

    for name in ("docs", "syncreward"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[gone](troubleshooting.md#no-such-entry)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "does not contain an anchor '#no-such-entry'" in proc.stderr
