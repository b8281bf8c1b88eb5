"""The package's public names: the host contract, one list, held here, listed in the README."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import flare_l2evict

INIT = Path(flare_l2evict.__file__)
README = INIT.parents[1] / "README.md"

PUBLIC = {
    # the host contract: hook spec, runtime protocol, markers
    "FlareRuntime",
    "FlareStartupSpec",
    "KVAllocator",
    "hookimpl",
    "hookspec",
    # the reports
    "ReclaimReport",
    "StartupAudit",
    "DeviceAudit",
    "RegionRead",
    # the errors
    "L2EvictError",
    "ConfigError",
    "CheckpointError",
    "InstallError",
    "WeightsError",
    "RuntimeContractError",
    "PluginNotFoundError",
    # the settings
    "L2EvictSettings",
    "load_deployment_config",
    # what a host, an operator or a program calls
    "restore",
    "evicting_from",
}


def test_the_public_names_are_the_host_contract_and_no_more() -> None:
    assert set(flare_l2evict._EXPORTS) == PUBLIC
    assert len(PUBLIC) <= 20


def test_the_readme_lists_exactly_the_public_names() -> None:
    text = README.read_text()
    section = text.split("## Public API", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`flare_l2evict\.([A-Za-z0-9_]+)`", section))
    assert listed - {"hookspecs", "plugin"} == PUBLIC  # the two modules are named too


def test_every_exported_name_resolves_from_its_module() -> None:
    for name, module in flare_l2evict._EXPORTS.items():
        value = getattr(flare_l2evict, name)
        assert value is getattr(__import__(f"flare_l2evict.{module}", fromlist=[name]), name)
    assert set(flare_l2evict.__all__) == {*flare_l2evict._EXPORTS, "__version__", "hookspecs"}


def test_the_type_checking_block_mirrors_the_one_list() -> None:
    tree = ast.parse(INIT.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    mirrored: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            mirrored[alias.asname or alias.name] = node.module.lstrip(".")
    assert mirrored == flare_l2evict._EXPORTS


def test_unknown_names_are_attribute_errors() -> None:
    try:
        flare_l2evict.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("an unknown name resolved")


def test_the_readmes_dotted_paths_work_as_written() -> None:
    """``flare_l2evict.hookspecs.FlareStartupSpec`` after a plain ``import flare_l2evict``."""
    code = (
        "import flare_l2evict, pluggy\n"
        "pm = pluggy.PluginManager('flare')\n"
        "pm.add_hookspecs(flare_l2evict.hookspecs.FlareStartupSpec)\n"
        "assert flare_l2evict.hookspec is flare_l2evict.hookspecs.hookspec\n"
        "assert callable(flare_l2evict.hookimpl)\n"
        "import sys; print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"  # the contract costs no torch import
