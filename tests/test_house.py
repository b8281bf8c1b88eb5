"""The house rules a reviewer would otherwise check by hand (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path

import flare_l2evict

RUNTIME = Path(flare_l2evict.__file__).parent
LIMIT = 50


def _runtime_modules() -> list[Path]:
    """Every runtime module: flare_l2evict/*.py and its subpackages, never tools/."""
    return sorted(
        path for path in RUNTIME.rglob("*.py") if "tools" not in path.relative_to(RUNTIME).parts
    )


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports anywhere (at load, in a function, for types)."""
    package = ".".join(("flare_l2evict", *path.relative_to(RUNTIME).parent.parts))
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flare_l2evict"):
            found.add(str(node.module))
    return found


def _graph() -> dict[str, set[str]]:
    """Each runtime module's imports of other runtime modules (the package itself left out)."""
    names = {
        ".".join(("flare_l2evict", *path.relative_to(RUNTIME).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): path
        for path in _runtime_modules()
    }
    modules = set(names) - {"flare_l2evict"}  # the package's lazy exports load on first use
    return {name: _imports(path) & modules for name, path in names.items() if name in modules}


def test_the_runtime_has_no_import_cycle() -> None:
    # Issue 27: _install <-> _lifecycle was one; each module's imports run one way.
    graph = _graph()
    cycles: list[str] = []

    def visit(name: str, trail: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in trail:
                cycles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif len(trail) < len(graph):
                visit(target, [*trail, target])

    for start in sorted(graph):
        visit(start, [start])
    assert cycles == [], cycles[:5]


def test_no_runtime_function_in_a_subpackage_is_over_fifty_lines() -> None:
    long: list[str] = []
    for path in _runtime_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{path.relative_to(RUNTIME)}:{node.lineno} {node.name}")
    assert long == [], f"runtime functions over {LIMIT} lines: {long}"


def test_only_the_b12x_wing_names_b12x() -> None:
    # Issue 27: one package holds everything that names b12x: its table, proof, provider, patch.
    wing = RUNTIME / "_b12x"
    spelled: list[str] = []
    for path in _runtime_modules():
        if wing in path.parents:
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(name == "b12x" or name.startswith(("b12x.", "flashinfer")) for name in names):
                spelled.append(f"{path.name} imports {names}")
        for name in ("_l2_flush_fn", "use_startup_eviction"):
            if name in text:
                spelled.append(f"{path.name} names {name}")
    assert spelled == [], spelled


# Issue 34: calls go down. The adapters (hosts, programs) sit on the core, the core on the
# start-up object, and the start-up object on passive parts that never call back up.
ADAPTERS = {"flare_l2evict.plugin", "flare_l2evict._program", "flare_l2evict._read_host"}
CORE = "flare_l2evict._core"
STARTUP = "flare_l2evict._startup"


def test_no_module_below_the_start_up_object_imports_it() -> None:
    graph = _graph()
    above = {*ADAPTERS, CORE, STARTUP}
    climbing = {
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name not in above
        for target in targets & above
    }
    assert climbing == set(), sorted(climbing)
    assert graph[STARTUP] & {*ADAPTERS, CORE} == set(), "the start-up object imports its callers"
    assert graph[CORE] & ADAPTERS == set(), "the core imports an adapter"


def test_the_passive_parts_take_no_callback_into_the_start_up() -> None:
    # Issue 34: Holder, Locked, current=, body/internal closures and the tensors thunk went.
    gone = (
        "class Holder",
        "class Locked",
        "current:",
        "body:",
        "internal:",
        "Callable[[], Mapping",
    )
    found = [
        f"{path.relative_to(RUNTIME)}: {text}"
        for path in _runtime_modules()
        for text in gone
        if text in path.read_text(encoding="utf-8")
    ]
    assert found == [], found


def test_only_the_start_up_object_reads_its_phase() -> None:
    # Issue 46: _core read `startup.phase is not Phase.INSTALLED`; it asks the start-up now
    # (Startup.awaits_offer), so the phase table has one reader.
    peeking = []
    for path in _runtime_modules():
        if path == RUNTIME / "_startup.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "phase":
                peeking.append(f"{path.relative_to(RUNTIME)}:{node.lineno} .phase")
            if isinstance(node, ast.alias) and node.name == "Phase":
                peeking.append(f"{path.relative_to(RUNTIME)} imports Phase")
    assert peeking == [], peeking


def test_only_faulted_raises_the_fallback_error_and_the_raise_rule_is_spelled_once() -> None:
    # Issue 42: start() let every L2EvictError through (`issubclass(type(error), L2EvictError)`);
    # it now lets through the one class only _core.faulted raises. And on_error = "raise" was
    # read three ways (_settings.wants_raise, BlockArguments.raising, `== "raise"`).
    raising, spelled = [], []
    for path in _runtime_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Raise) and "FallbackError" in ast.unparse(node):
                    raising.append(f"{path.name}:{function.name}")
                if isinstance(node, ast.Compare) and "'raise'" in ast.unparse(node):
                    spelled.append(f"{path.name}:{function.name}")
    assert sorted(set(raising)) == ["_core.py:faulted"]
    assert spelled == ["_settings.py:on_error_raises"]


def test_the_tools_never_import_from_the_package_root() -> None:
    # Issue 42: tools/_races_check.py took evicting_from from the package root while the root
    # loads tools/_config_file lazily: the one arrow in the tools wing that pointed back up.
    # Each tools module names the runtime module it needs (flare_l2evict._program, ...).
    tools = RUNTIME / "tools"
    rooted = []
    for path in sorted(tools.rglob("*.py")):
        package = ".".join(("flare_l2evict", *path.relative_to(RUNTIME).parent.parts))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
            elif isinstance(node, ast.Import):
                rooted += [
                    f"{path.relative_to(RUNTIME)}: import {alias.name}"
                    for alias in node.names
                    if alias.name == "flare_l2evict"
                ]
                continue
            else:
                continue
            if target == "flare_l2evict":
                rooted.append(f"{path.relative_to(RUNTIME)}: from {target} import ...")
    assert rooted == [], rooted


def test_each_command_is_one_room_of_the_cli_and_none_is_over_400_lines() -> None:
    # Issue 42: the CLI's front door held five commands in 932 lines.
    from flare_l2evict.tools.cli import COMMANDS

    cli = RUNTIME / "tools" / "cli"
    rooms = {path.stem for path in cli.glob("*.py") if not path.stem.startswith("_")}
    assert rooms == {command.name for command in COMMANDS}
    lines = {room: len((cli / f"{room}.py").read_text().splitlines()) for room in rooms}
    assert max(lines.values()) <= 400, lines
