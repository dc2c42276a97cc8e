"""The documentation site builds, strictly, and its links hold (issue 25).

``mkdocs build --strict`` with ``mkdocs.yml``'s validation settings turns every broken link into
a failure: to a page, to an anchor in a page, and (through ``docs/hooks/repo_files.py``) to a
repository file outside ``docs/``. The experiment file's field reference is generated from the
JSON Schema while building (``docs/hooks/schema_reference.py``), so it cannot drift; here it is
checked to list every field. The README is not part of the site: its links are checked here.
"""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.spec.schema import json_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOKS = DOCS / "hooks"
OUTPUT_MARK = re.compile(r"<!-- output: (\S+) -->\n```text\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)], cwd=config.parent, text=True,
                          capture_output=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """This repository's site, built once for the module."""
    out = tmp_path_factory.mktemp("site")
    return _build(ROOT / "mkdocs.yml", out), out


@pytest.fixture()
def site(build) -> Path:
    result, out = build
    if result.returncode != 0:
        pytest.fail("the site does not build (see test_the_site_builds_in_strict_mode)")
    return out


def test_the_site_builds_in_strict_mode(build):
    result, out = build
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "index.html").is_file()
    assert (out / "reference" / "experiment-file.html").is_file()


def _mini_site(tmp_path: Path, page: str) -> Path:
    """A site with this repository's settings and hooks, one page, and one repository file
    (``results/ok.csv``) beside its docs directory."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir="docs", site_dir="site", nav=["index.md", "other.md"],
                  hooks=[str(h) for h in sorted(HOOKS.glob("*.py"))])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page, encoding="utf-8")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n", encoding="utf-8")
    (tmp_path / "docs" / "reference").mkdir()  # the schema hook's page, with its marker
    (tmp_path / "docs" / "reference" / "experiment-file.md").write_text(
        "# Fields\n\n<!-- generated: the experiment file's fields -->\n", encoding="utf-8")
    config["nav"].append("reference/experiment-file.md")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ok.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path / "mkdocs.yml"


@pytest.mark.parametrize("link", [
    "[a page](missing.md)",
    "[an anchor](other.md#no-such-section)",
    "[a section of this page](#no-such-section)",
    "[a repository file](../results/missing.csv)",
    "[outside the repository](../../etc/hostname)",
    "[an image](../results/missing.png)",
])
def test_a_broken_link_fails_the_build(tmp_path, link):
    r = _build(_mini_site(tmp_path, f"# Home\n\n{link}\n"), tmp_path / "site")
    target = link[link.index("(") + 1:-1]
    assert r.returncode != 0, f"{link} did not fail the build"
    out = r.stdout + r.stderr
    assert "Aborted with 1 warnings in strict mode" in out, out  # this link's, nothing else
    assert f"'{target}'" in out or f"'{target.lstrip('#')}'" in out, out


def test_good_links_build_and_repository_files_are_copied(tmp_path):
    page = ("# Home\n\n[page](other.md), [anchor](other.md#a-section), "
            "[file](../results/ok.csv), [fields](reference/experiment-file.md#workload)\n")
    r = _build(_mini_site(tmp_path, page), tmp_path / "site")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "repo" / "results" / "ok.csv.txt").read_text() == "a,b\n1,2\n"
    assert 'href="repo/results/ok.csv.txt"' in (tmp_path / "site" / "index.html").read_text()


def _fields(schema: dict) -> dict[str, list[str]]:
    defs = schema["$defs"]
    return {"top level": list(schema["properties"]),
            **{name: list(d["properties"]) for name, d in defs.items() if "properties" in d}}


def test_the_reference_lists_every_field_of_the_schema(site):
    """Every section of the schema has a table in the built reference, with every field."""
    text = (site / "reference" / "experiment-file.html").read_text(encoding="utf-8")
    tables = {}
    for m in re.finditer(r'<h3 id="([^"]+)">(.*?)<a class="headerlink".*?</h3>(.*?)</table>',
                         text, re.S):
        tables[html.unescape(re.sub(r"<[^>]+>", "", m[2])).strip()] = m[3]
    missing = []
    for section, fields in _fields(json_schema()).items():
        title = "The top level" if section == "top level" else section
        if title not in tables:
            missing.append(section)
            continue
        cells = set(re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", tables[title]))
        missing += [f"{section}.{f}" for f in fields if f not in cells]
    assert not missing, f"not in the built reference: {missing}"


def test_the_reference_page_keeps_its_marker():
    page = (DOCS / "reference" / "experiment-file.md").read_text(encoding="utf-8")
    assert "<!-- generated: the experiment file's fields -->" in page


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if HOOKS not in p.parents)


def _tracked(path: str) -> bool:
    r = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=ROOT,
                       capture_output=True, check=False, timeout=30)
    return r.returncode == 0


def test_quoted_outputs_are_the_committed_ones():
    """A block marked ``<!-- output: FILE -->`` quotes FILE, a committed command output."""
    quoted = 0
    for page in _pages():
        for m in OUTPUT_MARK.finditer(page.read_text(encoding="utf-8")):
            path, block = m[1], m[2]
            assert _tracked(path), f"{page.name}: {path} is not committed"
            assert block in (ROOT / path).read_text(encoding="utf-8"), \
                f"{page.name}: the block marked {path} is not in it"
            quoted += 1
    assert quoted >= 6  # the tutorial's: validate twice, plan, simulate, run, the CSV


def test_the_tutorial_experiment_is_the_shipped_file():
    tutorial = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", tutorial, re.S)[1]
    assert block == (ROOT / "experiments" / "first.yaml").read_text(encoding="utf-8")


def test_the_readme_diagram_is_the_design_one():
    def diagram(path: Path) -> str:
        return re.search(r"```\n(exp\.yaml .*?)```", path.read_text(encoding="utf-8"), re.S)[1]

    assert diagram(ROOT / "README.md") == diagram(DOCS / "architecture.md")


def test_readme_links_resolve(site):
    """Every relative link of the README names a path that exists; one into ``docs/`` with an
    anchor names a heading the built page has."""
    readme = ROOT / "README.md"
    broken = []
    for m in LINK.finditer(readme.read_text(encoding="utf-8")):
        target = m[1]
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor and path.startswith("docs/") and path.endswith(".md"):
            built = site / (path[len("docs/"):-len(".md")] + ".html")
            if f'id="{anchor}"' not in built.read_text(encoding="utf-8"):
                broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"
