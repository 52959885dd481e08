"""The shape of the package, checked: its layers, no import cycles, one error base class,
nothing in the repository pointing at a file outside it. docs/architecture.md says why."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
from pathlib import Path

import autoloop
from autoloop.core.errors import AutoloopError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autoloop"
# Exceptions that never reach the user: control flow between two parts of the harness.
INTERNAL = {"ProposalFailed", "PlotUnavailable", "IsolationError",
            "NotFound"}   # the dashboard's 404, answered to the browser, never raised to the CLI


# The layers, bottom first: a module may import its own layer and those before it, never
# one after it. This is the one list; docs/architecture.md shows it in the same order
# (checked below). "contract" is train.py's side: autoloop.data and autoloop.evaluate,
# whose import paths train.py fixes.
LAYERS = ["core", "contract", "config", "store", "execution", "repo", "observe", "proposers",
          "engine", "verification", "review", "cli"]
CONTRACT = {"autoloop.data", "autoloop.evaluate", "autoloop.corpora"}


def layer_of(module: str) -> str | None:
    """The layer a module belongs to; None for the package itself."""
    if module in CONTRACT:
        return "contract"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def modules() -> dict[str, Path]:
    found = {"autoloop": PACKAGE / "__init__.py"}
    for info in pkgutil.walk_packages([str(PACKAGE)], "autoloop."):
        path = PACKAGE.joinpath(*info.name.split(".")[1:])
        found[info.name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every autoloop module `name` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:   # relative: not used in this package, but read correctly
                base = ".".join(name.split(".")[:-node.level] + [node.module])
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def test_no_import_cycles():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    graph["autoloop"] = set()   # the package itself imports nothing of its own
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue   # a package importing its own submodule is not a cycle
            assert state.get(nxt) != "open", " -> ".join([*trail, node, nxt])
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_every_user_facing_error_derives_from_one_base():
    seen = []
    for name in modules():
        if name.endswith(".__main__"):
            continue   # running it is its job
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, Exception) and cls_name not in INTERNAL:
                seen.append(cls_name)
                assert issubclass(cls, AutoloopError), f"{name}.{cls_name} does not derive from AutoloopError"
    assert len(seen) >= 10, seen
    cli = (PACKAGE / "cli" / "main.py").read_text()
    assert "except AutoloopError" in cli and not re.search(r"except \(\w+Error, ", cli)


def test_nothing_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"\.\./shared|DESIGN\.md")
    for name in tracked:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".toml", ".txt", "") or not path.is_file():
            continue
        if Path(name) == Path(__file__).relative_to(ROOT):
            continue
        text = path.read_text(errors="replace")
        assert not outside.search(text), f"{name} points outside the repository: {outside.search(text).group()}"


def test_the_architecture_document_names_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for name in modules():
        if name != "autoloop":
            leaf = name.rsplit(".", 1)[1]   # the tree names a package's modules indented under it
            named = re.search(rf"(^|\s){re.escape(leaf)}(\.py|/)\s", text, re.MULTILINE)
            assert named, f"docs/architecture.md does not name {name}"
    assert autoloop.__file__


def test_every_module_is_in_a_layer():
    for name in modules():
        if name != "autoloop":
            assert layer_of(name) in LAYERS, f"{name} is in no layer (autoloop/<layer>/ or train.py's contract)"


def test_no_module_imports_a_higher_layer():
    found = modules()
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = []
    for name, path in found.items():
        if name == "autoloop":
            continue
        for target in imports_of(name, path, set(found)):
            if target != "autoloop" and rank[layer_of(target)] > rank[layer_of(name)]:
                upward.append(f"{name} ({layer_of(name)}) imports {target} ({layer_of(target)})")
    assert not upward, "imports of a higher layer:\n" + "\n".join(sorted(upward))


def test_the_architecture_document_lists_the_layers_in_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\| (\d+) \| `(\w+)` \|", text, re.MULTILINE)
    assert [layer for _, layer in listed] == LAYERS[::-1], listed


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table under `## heading`, each a list of its cells."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows if not set(row) <= set("|-: ")]


def _stems() -> dict[str, set[str]]:
    """Every module's and package's own name, and the layers it names something in."""
    found: dict[str, set[str]] = {}
    for name in modules():
        layer, leaf = layer_of(name), name.rsplit(".", 1)[-1]
        if layer in (None, "contract") or leaf in ("__init__", "__main__") or name == f"autoloop.{layer}":
            continue
        found.setdefault(leaf, set()).add(layer)
    return found


def test_a_feature_across_layers_has_one_stem_and_its_row():
    rows = _table((ROOT / "docs" / "architecture.md").read_text(), "Features across layers")
    header, rows = rows[0], rows[1:]
    assert header[0] == "feature" and set(header[1:]) <= set(LAYERS), header
    listed = {}
    for row in rows:
        stem, cells = row[0], dict(zip(header[1:], row[1:], strict=True))
        layers = {layer for layer, cell in cells.items() if cell}
        assert all(cells[layer] in (f"`{stem}.py`", f"`{stem}/`") for layer in layers), row
        listed[stem] = layers
    across = {stem: layers for stem, layers in _stems().items() if len(layers) > 1}
    assert listed == across, f"docs/architecture.md's feature table {listed} against the package {across}"


def test_retired_words_do_not_come_back():
    """The glossary's retired names: no identifier in the package, no module of that name."""
    import io
    import tokenize

    rows = _table((ROOT / "docs" / "architecture.md").read_text(), "The house's words")[1:]
    retired = [(name, "(as a module)" in cell.split(name, 1)[1][:16])
               for cell in (row[-1] for row in rows) for name in re.findall(r"`(\w+)`", cell)]
    assert len(retired) >= 5, retired
    stems = _stems()
    found = []
    for module, path in modules().items():
        names = {tok.string for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
                 if tok.type == tokenize.NAME}
        found += [f"{module}: {name}" for name, as_module in retired if not as_module and name in names]
    found += [f"a module named {name}" for name, as_module in retired if as_module and name in stems]
    assert not found, "retired names in use:\n" + "\n".join(found)
