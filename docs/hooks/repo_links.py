"""MkDocs hook: links from the docs to files of the repository outside `docs/` work on the site as on a code host.

A page links to a repository file with a relative path, as a code host resolves it
(`../benchmarks/grad_reg/README.md#gradient-spikes`, `../../recipes/configs/demo_cpu.yaml`). MkDocs knows only
`docs/`, so this hook, when the site is built:

- checks that every such target exists in the repository (a missing one fails the build, naming the page and link);
- adds each Markdown target (e.g. `benchmarks/README.md`) to the site as a page under `repo/`, whose own links are
  followed the same way, so its anchors are checked by MkDocs' `validation.anchors` like any page's, and every other
  target (a script, a YAML, a PNG) as a file copied under `repo/`; a link to a folder goes to its `README.md`;
- rewrites the links to those copies. The repository's top `README.md` is the site's home page.
"""

import os
import posixpath
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

PREFIX = "repo/"
# [text](target) and ![alt](target), the target without spaces; an optional "title" is kept as it is
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")

_repo_of: dict[str, str] = {}  # site src_uri -> the file's path in the repository
_src_of: dict[str, str] = {}  # repository path outside docs/ -> its site src_uri


def _links(markdown: str):
    """The link targets of a Markdown text, outside code blocks and code spans."""
    text = CODE.sub("", FENCE.sub("", markdown))
    return [m.group(2) for m in LINK.finditer(text)]


def _external(target: str) -> bool:
    return target.startswith(("#", "/")) or re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def _resolve(page_repo_path: str, target: str, root: str) -> str | None:
    """The repository path `target` points to from the page at `page_repo_path`; None for one inside `docs/`."""
    path = target.split("#", 1)[0]
    if not path:
        return None
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    if repo_path.startswith("docs/") or repo_path.startswith("../") or repo_path == "..":
        if repo_path.startswith(".."):
            raise PluginError(f"{page_repo_path}: link {target!r} leaves the repository")
        return None
    full = os.path.join(root, repo_path)
    if os.path.isdir(full):
        if not os.path.isfile(os.path.join(full, "README.md")):
            raise PluginError(f"{page_repo_path}: link {target!r} is a folder without a README.md")
        repo_path = posixpath.join(repo_path, "README.md")
    elif not os.path.isfile(full):
        raise PluginError(f"{page_repo_path}: link {target!r} names {repo_path}, which is not in the repository")
    return repo_path


def on_files(files, config):
    root = os.path.dirname(config.config_file_path)
    _repo_of.clear()
    _src_of.clear()
    queue = []
    for file in files.documentation_pages():
        _repo_of[file.src_uri] = "docs/" + file.src_uri
        queue.append((file.src_uri, file.content_string))
    _src_of["README.md"] = "index.md"  # the repository's README is the site's home page
    while queue:
        src_uri, text = queue.pop()
        for target in _links(text):
            if _external(target):
                continue
            repo_path = _resolve(_repo_of[src_uri], target, root)
            if repo_path is None or repo_path in _src_of:
                continue
            new_src = PREFIX + repo_path
            _src_of[repo_path] = new_src
            _repo_of[new_src] = repo_path
            abs_path = os.path.join(root, repo_path)
            if repo_path.endswith(".md"):
                with open(abs_path, encoding="utf-8") as handle:
                    content = handle.read()
                new = File.generated(config, new_src, content=content, inclusion=InclusionLevel.NOT_IN_NAV)
                queue.append((new_src, content))
            else:
                new = File.generated(config, new_src, abs_src_path=abs_path, inclusion=InclusionLevel.NOT_IN_NAV)
            files.append(new)
    return files


def on_page_markdown(markdown, page, config, files):
    root = os.path.dirname(config.config_file_path)
    src_uri = page.file.src_uri
    page_repo_path = _repo_of.get(src_uri, "docs/" + src_uri)

    def rewrite(match):
        target = match.group(2)
        if _external(target):
            return match.group(0)
        repo_path = _resolve(page_repo_path, target, root)
        if repo_path is None:
            if src_uri.startswith(PREFIX):  # a copied page's link into docs/: relative to docs/ on the site
                path, _, fragment = target.partition("#")
                docs_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))[5:]
                new = posixpath.relpath(docs_path, posixpath.dirname(src_uri) or ".")
                return match.group(1) + new + ("#" + fragment if fragment else "") + match.group(3)
            return match.group(0)
        fragment = target.partition("#")[2]
        new = posixpath.relpath(_src_of[repo_path], posixpath.dirname(src_uri) or ".")
        return match.group(1) + new + ("#" + fragment if fragment else "") + match.group(3)

    parts = []
    last = 0
    for block in FENCE.finditer(markdown):  # leave fenced code as it is
        parts.append(LINK.sub(rewrite, markdown[last : block.start()]))
        parts.append(block.group(0))
        last = block.end()
    parts.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(parts)
