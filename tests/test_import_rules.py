"""The layering rules of the two packages, read from their source with `ast` (nothing is imported):

- inside each package, imports flow one way: no module reaches itself again through its imports,
  counting every import statement, those inside functions included (a policy config names its class
  and LeRobot adapter by module name, `config/registry.py: imported`, so it imports neither);
- each package's folders are its layers (`LAYERS`, lowest first): a module imports only from its own
  layer or the layers below it;
  imports under `if TYPE_CHECKING:` count too (an annotation is a dependency of the reader);
- the metadata path of ckpt_tools (format, files, dcp, catalog) never imports torch;
- ckpt_tools never imports accelerate, peft or trainer;
- the trainer uses only the names ckpt_tools exports, in its two tiers: the top level
  (`ckpt_tools/__init__.py`: `import ckpt_tools` then `ckpt_tools.<name>`, or `from ckpt_tools import
  <name>`) and the trainer's tier (`ckpt_tools/training.py`: `ckpt_tools.training.<name>`, or
  `from ckpt_tools.training import <name>`), never another ckpt_tools submodule directly.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import ckpt_tools
import ckpt_tools.training

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
SOURCES = {
    "ckpt_tools": PACKAGES / "ckpt-tools" / "src",
    "trainer": PACKAGES / "trainer" / "src",
}


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (packages' __init__ included)."""
    root = SOURCES[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(module: str, path: Path) -> Iterator[tuple[ast.stmt, list[str]]]:
    """Every import statement of a module (at any depth) and the dotted names it imports: for
    `from a.b import c` both `a.b.c` and `a.b`, since `c` may be a module or a name in `a.b`."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                anchor = here[: len(here) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield node, [f"{base}.{alias.name}" for alias in node.names] + [base]


def _edges(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports. `from pkg import name` counts as an edge
    to `pkg.name` when that is a module, else to `pkg`; a package's `__init__` is left out as a target
    when the name is a module of it (the lazy export table is not layering)."""
    modules = _modules(package)
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node, targets in _imports(name, path):
            if isinstance(node, ast.ImportFrom):
                names = targets[:-1]
                dotted = [t for t in names if t in modules]
                if len(dotted) < len(names):
                    dotted.append(targets[-1])
            else:
                dotted = targets
            edges[name].update(t for t in dotted if t in modules and t != name and t != package)
    return edges


# The layers of each package, lowest first: the first name below the package (a folder, or a module at
# its root). The package's `__init__` (the export table) is not a layer.
LAYERS = {
    "ckpt_tools": ("_version", "_lazy", "errors", "format", "files", "dcp", "catalog", "tensors", "reports", "state", "tools", "cli", "training"),
    "trainer": ("errors", "config", "data", "policies", "reporting", "distributed", "evaluation", "engine", "cli"),
}  # fmt: skip


# Rooms inside a layer, lowest first, under the same rule: a module of a room imports only from its own
# room or the rooms below it (the layer's root modules are rooms of their own). A tuple is a level of
# peer rooms that never import each other (one folder per policy above their shared blocks).
ROOMS: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "trainer.policies": ("common", ("act", "diffusion", "fastwam", "mlp", "pi", "smolvla")),
    "trainer.data": ("dataset", "format", "pipeline", "embedded", "sources"),
    "trainer.engine": (
        "host_memory",
        "ema",
        "peft_policy",
        "loss_window",
        "run",
        "banner",
        "build",
        "checkpoint",
        "startup",
        "committed_step",
        "loop",
        "plan",
    ),
}


def _room(layer: str, module: str) -> tuple[int, str]:
    """The level of `module`'s room in `layer` and the room's name."""
    top = module[len(layer) + 1 :].split(".")[0]
    for level, rooms in enumerate(ROOMS[layer]):
        if top in ((rooms,) if isinstance(rooms, str) else rooms):
            return level, top
    raise AssertionError(f"{module} is in no room of {layer}: add it to ROOMS (and docs/architecture.md)")


def _upward_room_imports(layer: str) -> list[str]:
    """`module -> target` for every import inside `layer` that goes up a room or across to a peer."""
    package = layer.split(".")[0]
    inside = layer + "."

    def goes_up(module: str, target: str) -> bool:
        (here, room), (there, other) = _room(layer, module), _room(layer, target)
        return there > here or (there == here and other != room)

    return sorted(
        f"{module} -> {target}"
        for module, targets in _edges(package).items()
        if module.startswith(inside)
        for target in targets
        if target.startswith(inside) and goes_up(module, target)
    )


def _layer(package: str, module: str) -> int:
    top = module.split(".")[1]
    layers = LAYERS[package]
    assert top in layers, (
        f"{module} is in no layer of {package}: add its folder to LAYERS (and docs/architecture.md)"
    )
    return layers.index(top)


def _upward_imports(package: str) -> list[str]:
    """`module -> target` for every import that goes up a layer."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in _edges(package).items()
        if module != package
        for target in targets
        if _layer(package, target) > _layer(package, module)
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    """The rule can fail: two modules importing each other, one of them inside a function."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import g\n")
    (package / "c.py").write_text("from pkg import a\n")
    SOURCES["pkg"] = tmp_path
    try:
        assert _cycles(_edges("pkg")) == [["pkg.a", "pkg.b"]]
    finally:
        del SOURCES["pkg"]


def test_layer_rule_sees_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    """The rule can fail: a low layer that imports a higher one, inside a function."""
    package = tmp_path / "pkg"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "high" / "b.py").write_text("from pkg.low import a\n")
    (package / "low" / "a.py").write_text("def f():\n    from pkg.high.b import g\n")
    SOURCES["pkg"], LAYERS["pkg"] = tmp_path, ("low", "high")
    try:
        assert _upward_imports("pkg") == ["pkg.low.a -> pkg.high.b"]
    finally:
        del SOURCES["pkg"], LAYERS["pkg"]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_go_down_the_layers(package: str) -> None:
    upward = _upward_imports(package)
    assert not upward, f"imports that go up a layer of {package}: " + "; ".join(upward)


@pytest.mark.parametrize("layer", sorted(ROOMS))
def test_imports_go_down_the_rooms(layer: str) -> None:
    upward = _upward_room_imports(layer)
    assert not upward, f"imports that go up a room of {layer}: " + "; ".join(upward)


def test_room_rule_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule can fail: a low room that imports a higher one."""
    layer = tmp_path / "pkg" / "data"
    for room in ("low", "high"):
        (layer / room).mkdir(parents=True)
        (layer / room / "__init__.py").write_text("")
    (layer.parent / "__init__.py").write_text("")
    (layer / "__init__.py").write_text("")
    (layer / "low" / "a.py").write_text("def f():\n    from pkg.data.high import b\n")
    (layer / "high" / "b.py").write_text("")
    SOURCES["pkg"], ROOMS["pkg.data"] = tmp_path, ("low", "high")
    try:
        assert _upward_room_imports("pkg.data") == ["pkg.data.low.a -> pkg.data.high.b"]
    finally:
        del SOURCES["pkg"], ROOMS["pkg.data"]


def test_room_rule_sees_an_import_between_peers(tmp_path: Path) -> None:
    """The rule can fail: a room that imports a peer of its level (one policy's folder another's)."""
    layer = tmp_path / "pkg" / "policies"
    for room in ("common", "one", "two"):
        (layer / room).mkdir(parents=True)
        (layer / room / "__init__.py").write_text("")
    (layer.parent / "__init__.py").write_text("")
    (layer / "__init__.py").write_text("")
    (layer / "one" / "a.py").write_text("from pkg.policies.common import c\nfrom pkg.policies.two import b\n")
    (layer / "two" / "b.py").write_text("")
    (layer / "common" / "c.py").write_text("")
    SOURCES["pkg"], ROOMS["pkg.policies"] = tmp_path, ("common", ("one", "two"))
    try:
        assert _upward_room_imports("pkg.policies") == ["pkg.policies.one.a -> pkg.policies.two.b"]
    finally:
        del SOURCES["pkg"], ROOMS["pkg.policies"]


def _patched_attributes(path: Path) -> list[str]:
    """`Name.attr = ...` statements at a module's top level: a class changed after its module ran."""
    return [
        f"{path.name}:{node.lineno}"
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
    ]


def test_no_policy_module_binds_an_attribute_after_import(tmp_path: Path) -> None:
    """A config reaches its class one way, `policy_class()`'s import: no module binds it (or anything
    else) onto a class from outside, as `DiffusionConfig.built_by = DiffusionPolicy` once did."""
    patched = tmp_path / "patched.py"
    patched.write_text("class A:\n    built_by = None\n\n\nA.built_by = int\n")
    assert _patched_attributes(patched) == ["patched.py:5"]  # the rule can fail
    policies = SOURCES["trainer"] / "trainer" / "policies"
    found = [hit for path in sorted(policies.rglob("*.py")) for hit in _patched_attributes(path)]
    assert not found, f"attributes bound after import: {found}"


def test_the_metadata_path_never_imports_torch() -> None:
    torch_free = ("errors", "format", "files", "dcp", "catalog")
    offenders = [
        f"{module}: {target}"
        for module, path in _modules("ckpt_tools").items()
        if module != "ckpt_tools" and module.split(".")[1] in torch_free
        for _, targets in _imports(module, path)
        for target in targets
        if target.split(".")[0] == "torch"
    ]
    assert not offenders, f"torch on the metadata path: {offenders}"


@pytest.mark.parametrize("package", ["ckpt_tools", "trainer"])
def test_imports_flow_one_way(package: str) -> None:
    cycles = _cycles(_edges(package))
    assert not cycles, f"import cycles in {package}: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_ckpt_tools_never_imports_the_trainer_side() -> None:
    forbidden = ("accelerate", "peft", "trainer")
    offenders = [
        f"{module}: {target}"
        for module, path in _modules("ckpt_tools").items()
        for _, targets in _imports(module, path)
        for target in targets
        if target.split(".")[0] in forbidden
    ]
    assert not offenders


TIERS = ("ckpt_tools", "ckpt_tools.training")  # the export tables the trainer may take names from


def _trainer_uses_of_ckpt_tools() -> Iterator[tuple[str, str]]:
    """(trainer module, what it takes from ckpt_tools): a top-level name, `training.<name>` for the
    trainer's tier, or the dotted path of any other submodule it reaches into."""
    for module, path in _modules("trainer").items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: dict[str, str] = {}  # local name -> the export table it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "ckpt_tools":
                        bound[alias.asname or "ckpt_tools"] = "ckpt_tools"
                    elif alias.name.startswith("ckpt_tools."):
                        yield module, alias.name
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ckpt_tools":
                if node.module not in TIERS:
                    yield module, node.module or ""
                    continue
                prefix = "" if node.module == "ckpt_tools" else "training."
                for alias in node.names:
                    yield module, prefix + alias.name
                    if node.module == "ckpt_tools" and alias.name == "training":
                        bound[alias.asname or alias.name] = "ckpt_tools.training"
        yield from _attribute_uses(module, tree, bound)


def _attribute_uses(module: str, tree: ast.AST, bound: dict[str, str]) -> Iterator[tuple[str, str]]:
    """`ckpt_tools.<name>`, `ckpt_tools.training.<name>` and `<bound tier>.<name>` in `tree`."""
    inner = set()  # `ckpt_tools.training` nodes read as part of a longer `ckpt_tools.training.<name>`
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            if bound.get(value.value.id) == "ckpt_tools" and value.attr == "training":
                inner.add(id(value))
                yield module, f"training.{node.attr}"
        elif isinstance(value, ast.Name) and value.id in bound and id(node) not in inner:
            tier = bound[value.id]
            yield module, node.attr if tier == "ckpt_tools" else f"training.{node.attr}"


def _exported() -> set[str]:
    """Every name the two tiers export, the trainer's as `training.<name>`."""
    return {*ckpt_tools.__all__, *(f"training.{name}" for name in ckpt_tools.training.__all__)}


def test_trainer_uses_only_names_ckpt_tools_exports() -> None:
    uses = list(_trainer_uses_of_ckpt_tools())
    assert len(uses) > 10  # the walk does see the trainer's uses
    assert any(name.startswith("training.") for _, name in uses)  # ... of both tiers
    outside = sorted({f"{module}: {name}" for module, name in uses if name not in _exported()})
    assert not outside, "the trainer uses ckpt_tools names that neither tier exports: " + ", ".join(outside)


def test_the_uses_walk_sees_every_spelling_of_both_tiers(tmp_path: Path) -> None:
    """The rule can fail: each way of naming a ckpt_tools member is seen, a name moved to the trainer's
    tier but used at the top level included."""
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "import ckpt_tools\n"
        "from ckpt_tools import layout, training\n"
        "from ckpt_tools import training as ckpt_training\n"
        "from ckpt_tools.training import RunShape\n"
        "from ckpt_tools.state import save\n"
        "ckpt_tools.open_checkpoint, ckpt_tools.save_checkpoint, ckpt_tools.training.plan_resume\n"
        "training.load_training_state, ckpt_training.main_decides\n"
    )
    saved = SOURCES["trainer"]
    SOURCES["trainer"] = tmp_path
    try:
        uses = {name for _, name in _trainer_uses_of_ckpt_tools()}
    finally:
        SOURCES["trainer"] = saved
    assert uses == {
        "layout",
        "training",
        "training.RunShape",
        "ckpt_tools.state",
        "open_checkpoint",
        "save_checkpoint",
        "training.plan_resume",
        "training.load_training_state",
        "training.main_decides",
    }
    assert uses - _exported() == {"ckpt_tools.state", "save_checkpoint"}
