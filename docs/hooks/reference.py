"""The configuration reference, generated from the code into `docs/configuration.md` (no hand-copied table), and the
MkDocs hook that checks it is current when the site is built.

    python docs/hooks/reference.py     # rewrites the generated parts of docs/configuration.md (imports the package)

`docs/configuration.md` holds two generated parts, each between a start marker and an end marker (HTML comments, not
shown), so that the page reads as plain Markdown on a code host as on the site:

- `<!-- generated: GRPOConfig -->`: the fields this package adds, from the class docstring of
  `trl_grpo_ext.GRPOConfig`, one table per `> Parameters that control ...` section (TRL's docstring style: a
  `name (type, *optional*, defaults to value):` line, then its description indented below it); the prose of a
  section comes before its table. A test keeps that docstring and the fields' `help` metadata in sync.
- `<!-- generated: GSM8KScriptArguments -->`: the GSM8K recipe's script fields, from the dataclass in
  `recipes/math_gsm8k.py` (name, default, `help` metadata).

Run as a script, this module writes both parts from the imported docstring. When the site is built, the hook reads the
same by static analysis (griffe and `ast`; nothing is imported, so the docs build needs no torch) and fails the build
when the page's parts differ (stale) or a marker is missing. `tests/meta/test_docs.py` checks that the page is current
and that the tables list every field (it imports this module without MkDocs).
"""

import ast
import glob
import inspect
import os
import re
import textwrap

try:
    from mkdocs.exceptions import PluginError
except ImportError:  # imported without MkDocs (tests/meta/test_docs.py): the same checks, as ValueError
    PluginError = ValueError

PAGE = "configuration.md"
CONFIG_MARKER = "<!-- generated: GRPOConfig -->"
SCRIPT_MARKER = "<!-- generated: GSM8KScriptArguments -->"
END_MARKER = "<!-- end of generated part -->"
WRITE = "python docs/hooks/reference.py"
FIELD = re.compile(r"^(\w+) \((.*)\):$")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_docstring(root: str) -> str:
    """The class docstring of `trl_grpo_ext.GRPOConfig` as the package composes it when imported
    (`trl_grpo_ext/config.py`): the class's own docstring, then the `> Parameters that control ...` section of each
    feature's part (the docstring of each fields class among the bases of `composition.FeatureFields`, a base of
    `GRPOConfig`, or of a user's subclass, the last-named first), all read statically."""
    import griffe  # the docs extra's (mkdocstrings' static analysis)

    package = griffe.load(
        "trl_grpo_ext", search_paths=[root], try_relative_path=False, resolve_aliases=True, resolve_external=False
    )  # from `root`, not from the working folder
    config = package["config"]["GRPOConfig"]
    if config.docstring is None:
        raise PluginError("trl_grpo_ext.GRPOConfig has no docstring that static analysis can read")
    sections = [textwrap.indent(section, " " * 8) for section in _field_sections(config)]
    if not sections:
        raise PluginError("GRPOConfig: no fields class found among its bases by static analysis")
    base = textwrap.indent(config.docstring.value, " " * 4)
    return "\n" + base + "\n" + "\n\n".join(sections) + "\n    "


def _field_sections(cls) -> list[str]:
    """The docstrings of the fields classes among `cls`'s bases, in dataclasses' order (the last-named base's fields
    first), through a base that gathers fields classes (`composition.FeatureFields`); TRL's config is left out."""
    sections = []
    for base in reversed(cls.bases):
        if str(base) == "TRLGRPOConfig":
            continue
        fields = cls.parent[str(base)]  # the name in the module that defines `cls`
        fields = fields.final_target if fields.is_alias else fields  # imported from the feature's config.py
        if fields.bases:  # a class of fields classes
            sections += _field_sections(fields)
        elif fields.docstring is None:
            raise PluginError(f"{fields.path} (a part of GRPOConfig) has no docstring section")
        else:
            sections.append(fields.docstring.value)
    return sections


def registered_modes(root: str, registry: str) -> str:
    """- `name`: summary. ... on one line, for each class decorated `@<registry>.register("name")` in the package, read
    with `ast`: the words `Registry.describe` fills into the docstring's `{<registry>}` placeholder when the package is
    imported (there on several lines)."""
    modes = []
    for folder, _, names in sorted(os.walk(os.path.join(root, "trl_grpo_ext"))):
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                for decorator in node.decorator_list:
                    if (
                        isinstance(decorator, ast.Call)
                        and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == "register"
                        and getattr(decorator.func.value, "id", None) == registry
                    ):
                        summary = next(
                            (
                                item.value.value
                                for item in node.body
                                if isinstance(item, ast.Assign)
                                and [getattr(t, "id", None) for t in item.targets] == ["summary"]
                                and isinstance(item.value, ast.Constant)
                            ),
                            None,
                        )
                        if summary is None:
                            raise PluginError(f"{name}: mode class {node.name} has no constant `summary`")
                        modes.append(f"- `{decorator.args[0].value}`: {summary}.")
    if not modes:
        raise PluginError(f"no mode registered in {registry}")
    return " ".join(modes)


def fill_placeholders(docstring: str, root: str) -> str:
    """The docstring with each `{REGISTRY}` line replaced by the modes registered there."""
    return re.sub(r"\{([A-Z_]+_MODES)\}", lambda match: registered_modes(root, match.group(1)), docstring)


def config_tables(docstring: str) -> str:
    """Markdown: per `> Parameters that control X` section, a `## X` heading, its prose and a table of its fields."""
    lines = inspect.cleandoc(docstring).split("\n")
    try:
        start = lines.index("Parameters:") + 1
    except ValueError as error:
        raise PluginError("GRPOConfig's docstring has no 'Parameters:' section") from error
    body = textwrap.dedent("\n".join(line for line in lines[start:])).split("\n")
    sections = []  # [title, prose lines, [(name, kind, description lines)]]
    for line in body:
        if line.startswith("> Parameters that control "):
            sections.append([line.removeprefix("> Parameters that control "), [], []])
        elif not sections:
            if line.strip():
                raise PluginError(f"GRPOConfig's docstring: text before the first '> Parameters' header: {line!r}")
        elif line and not line[0].isspace() and FIELD.match(line):
            name, kind = FIELD.match(line).groups()
            sections[-1][2].append((name, kind, []))
        elif line and not line[0].isspace() and not line.startswith(" ") and sections[-1][2]:
            raise PluginError(f"GRPOConfig's docstring: prose after a field in {sections[-1][0]!r}: {line!r}")
        elif sections[-1][2]:
            sections[-1][2][-1][2].append(line)
        else:
            sections[-1][1].append(line)
    if not sections or not all(fields for _, _, fields in sections):
        raise PluginError("GRPOConfig's docstring: no '> Parameters that control ...' section with fields")
    out = []
    for title, prose, fields in sections:
        out += [f"## {title[0].upper()}{title[1:]}", "", " ".join(" ".join(prose).split()), ""]
        out += ["| field | type and default | what it does |", "|---|---|---|"]
        out += [f"| `{name}` | {_cell(kind)} | {_cell(' '.join(desc))} |" for name, kind, desc in fields]
        out.append("")
    return "\n".join(out)


def _module_constant(root: str, tree: ast.Module, name: str):
    """The value of the module-level constant `name` of `tree`, or of the `trl_grpo_ext` module it is imported from:
    a literal, or a dict's keys (a registry of functions by name). Imports inside a top-level `try` count (the
    recipes import the GSM8K task's names there, to name its extra when it is missing)."""
    nodes = [inner for node in tree.body for inner in (node.body if isinstance(node, ast.Try) else [node])]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trl_grpo_ext"):
            if any((alias.asname or alias.name) == name for alias in node.names):
                path = os.path.join(root, *node.module.split("."))
                path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
                with open(path, encoding="utf-8") as handle:
                    return _module_constant(root, ast.parse(handle.read()), name)
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if isinstance(node, ast.Assign | ast.AnnAssign) and [getattr(t, "id", None) for t in targets] == [name]:
            if isinstance(node.value, ast.Dict):
                return [ast.literal_eval(key) for key in node.value.keys]
            return ast.literal_eval(node.value)
    raise PluginError(f"cannot read the constant {name} statically")


def _help_text(root: str, tree: ast.Module, node: ast.expr) -> str:
    """A `help` string, an f-string's `{', '.join(NAME)}` parts filled from the constant NAME."""
    if not isinstance(node, ast.JoinedStr):
        return ast.literal_eval(node)
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(value.value)
            continue
        call = value.value
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "join"
            and isinstance(call.func.value, ast.Constant)
            and len(call.args) == 1
            and isinstance(call.args[0], ast.Name)
        ):
            raise PluginError(f"help text part {ast.unparse(value)!r} cannot be read statically")
        parts.append(call.func.value.value.join(_module_constant(root, tree, call.args[0].id)))
    return "".join(parts)


def script_table(root: str, path: str, class_name: str = "GSM8KScriptArguments") -> str:
    """Markdown table of a dataclass's fields in `path`: name, default (as written) and `help` metadata."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    tree = ast.parse(source)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    if not classes:
        raise PluginError(f"{path}: no class {class_name}")
    rows = ["| field | default | what it does |", "|---|---|---|"]
    for node in classes[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        default, help_text = None, ""
        call = node.value
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "field":
            for keyword in call.keywords:
                if keyword.arg == "default":
                    default = ast.get_source_segment(source, keyword.value)
                elif keyword.arg == "default_factory":
                    default = ast.get_source_segment(source, keyword.value)
                    if isinstance(keyword.value, ast.Lambda):
                        default = ast.get_source_segment(source, keyword.value.body)
                elif keyword.arg == "metadata" and isinstance(keyword.value, ast.Dict):
                    for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "help":
                            help_text = _help_text(root, tree, value)
        elif call is not None:
            default = ast.get_source_segment(source, call)
        if not help_text:
            raise PluginError(f"{path}: {class_name}.{node.target.id} has no help metadata")
        rows.append(f"| `{node.target.id}` | `{default}` | {_cell(help_text)} |")
    return "\n".join(rows) + "\n"


def generated_parts(root: str, docstring: str) -> dict[str, str]:
    """Start marker -> the Markdown generated for it: `GRPOConfig`'s tables from `docstring` (its class docstring,
    placeholders filled), the GSM8K recipe's script fields from `recipes/math_gsm8k.py`."""
    recipe = os.path.join(root, "recipes", "math_gsm8k.py")
    return {CONFIG_MARKER: config_tables(docstring), SCRIPT_MARKER: script_table(root, recipe)}


def with_parts(markdown: str, parts: dict[str, str]) -> str:
    """`markdown` with the text between each start marker of `parts` and the next `END_MARKER` replaced by its part.

    Raises:
        PluginError: a start marker, or the end marker after it, is missing.
    """
    for marker, text in parts.items():
        start = markdown.find(marker)
        end = markdown.find(END_MARKER, start + 1) if start >= 0 else -1
        if end < 0:
            raise PluginError(f"docs/{PAGE}: no {marker} followed by {END_MARKER}")
        markdown = f"{markdown[: start + len(marker)]}\n\n{text.strip()}\n\n{markdown[end:]}"
    return markdown


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    root = os.path.dirname(config.config_file_path)
    current = with_parts(markdown, generated_parts(root, fill_placeholders(config_docstring(root), root)))
    if current != markdown:
        raise PluginError(f"docs/{PAGE}: its generated tables are not the code's: run `{WRITE}`")
    return markdown


def feature_pages(nav: list, docs_dir: str) -> list:
    """`nav` with every page of `docs/features/` that its "Features" section does not list added at the section's
    end, titled by the page's first heading: a new feature's page needs no line in `mkdocs.yml`. Returns `nav`.

    Raises:
        PluginError: `nav` has no "Features" section, or a page there has no `# ` heading.
    """
    section = next((item["Features"] for item in nav if isinstance(item, dict) and "Features" in item), None)
    if section is None:
        raise PluginError('mkdocs.yml: the nav has no "Features" section')
    listed = {path for item in section for path in item.values()}
    for path in sorted(glob.glob(os.path.join(docs_dir, "features", "*.md"))):
        page = f"features/{os.path.basename(path)}"
        if page in listed:
            continue
        with open(path, encoding="utf-8") as handle:
            title = next((line[2:].strip() for line in handle if line.startswith("# ")), None)
        if title is None:
            raise PluginError(f"docs/{page} has no '# ' heading to title it in the nav")
        section.append({title: page})
    return nav


def on_config(config):
    config["nav"] = feature_pages(config["nav"], config["docs_dir"])
    return config


def main() -> None:
    """Write the generated parts of `docs/configuration.md` from the imported package (run from the repository)."""
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, root)
    from trl_grpo_ext import GRPOConfig

    path = os.path.join(root, "docs", PAGE)
    with open(path, encoding="utf-8") as handle:
        markdown = handle.read()
    written = with_parts(markdown, generated_parts(root, GRPOConfig.__doc__))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(written)
    print(f"docs/{PAGE}: {'rewritten' if written != markdown else 'already current'}")


if __name__ == "__main__":
    main()
