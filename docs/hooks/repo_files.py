"""mkdocs hook: links from a page to a file of the repository outside ``docs/``.

A page links to ``../results/quickstart-example/results.csv`` or ``../../experiments/first.yaml``
as it would on a code host, relative to its own place in the repository, so the same Markdown
works there and in the site. mkdocs knows only what is under ``docs/``, so this hook adds every
such linked file that exists to the site, under ``repo/`` (text files with ``.txt`` appended,
so a browser shows them instead of downloading them). A link to a file that does not exist, or
to anything outside the repository, is left alone for mkdocs to report: with ``strict: true`` and
the ``validation`` settings of ``mkdocs.yml`` a broken link fails the build.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path
from urllib.parse import unquote

from mkdocs.structure.files import File, Files, InclusionLevel

# [text](target) and ![alt](target "title"), the target optionally in <...>
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
SHOWN_AS_IS = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".html", ".json", ".txt"}


class RepoFile(File):
    """A repository file copied into the site as it is (a ``.md`` one is not rendered)."""

    def is_documentation_page(self) -> bool:
        return False


def repo_targets(page: File) -> set[str]:
    """The targets, relative to ``docs/`` (so starting with ``../``), of the page's links that
    leave ``docs/``."""
    found = set()
    for m in LINK.finditer(page.content_string):
        target = unquote(m.group(1).split("#", 1)[0])
        if not target or SCHEME.match(target) or target.startswith("/"):
            continue
        uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri), target))
        if uri.startswith("../"):
            found.add(uri)
    return found


def on_files(files: Files, config) -> Files:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    for page in list(files.documentation_pages()):
        for uri in sorted(repo_targets(page)):
            path = (docs / uri).resolve()
            inside = root in path.parents and docs not in path.parents
            if not inside or not path.is_file() or files.get_file_from_path(uri) is not None:
                continue  # mkdocs reports what is not found
            rel = path.relative_to(root).as_posix()
            dest = "repo/" + rel + ("" if path.suffix.lower() in SHOWN_AS_IS else ".txt")
            files.append(RepoFile(uri, src_dir=str(docs), dest_dir=config["site_dir"],
                                  use_directory_urls=config["use_directory_urls"],
                                  dest_uri=dest, inclusion=InclusionLevel.INCLUDED))
    return files
