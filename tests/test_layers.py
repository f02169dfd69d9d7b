"""The rooms of gpuq/ and their arrows, read from the code's own imports: each room imports only
the rooms in layers below it, and docs/architecture.md's "The layers" lists the same layers in
the same order. A new import that runs upward (the front door reaching into the batches, the
store into the node) fails here, naming the file and the import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpuq"

# Top to bottom; rooms on one line are peers and do not import each other. "shared" is the
# modules at the top of gpuq/ (the pure rules: jobs, placement, errors, ...).
LAYERS = (
    ("cli",),
    ("ops",),
    ("api",),
    ("upkeep",),
    ("batches",),
    ("front",),
    ("node",),
    ("access",),
    ("store", "demo"),
    ("shared", "config"),
)
LAYER_OF = {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}
BASE = len(LAYERS) - 1  # the shared modules and config/ may import each other


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "shared"


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a gpuq module, relative ones resolved."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            found += [(node.lineno, target)] if target.startswith("gpuq") else []
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpuq")]
    return found


def test_every_room_is_in_a_layer():
    rooms = {room_of(m) for m in modules()}
    assert rooms - set(LAYER_OF) == set(), "a room with no layer: add it to LAYERS and docs/architecture.md"


def test_no_room_imports_a_room_above_it_or_beside_it():
    wrong = []
    for module, path in modules().items():
        here = room_of(module)
        for line, target in imports(module, path):
            there = room_of(target)
            if there == here or LAYER_OF[here] == LAYER_OF[there] == BASE:
                continue
            if LAYER_OF[there] <= LAYER_OF[here]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({here}/) imports {target} ({there}/)")
    assert wrong == []


def test_the_architecture_page_lists_the_layers_as_the_code_keeps_them():
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"## The layers\n.*?```text\n(.*?)```", page, re.S)
    assert block, "docs/architecture.md has no '## The layers' section with a text block"
    listed = tuple(tuple(re.findall(r"[a-z]+", line.split("#")[0])) for line in block.group(1).splitlines())
    assert listed == LAYERS
