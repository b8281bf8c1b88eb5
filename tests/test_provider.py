"""Where the environment cannot run the plugin, one line says what is there and what is needed.

Each environment is a stand-in: a directory of metadata-only ``*.dist-info``
records (and, where named, a ``b12x`` package folder), the only thing on the
path of a fresh interpreter started without site-packages (``python -S``).
``flare_l2evict._b12x.provider`` imports nothing but the standard library, so it
runs there as it does in a server.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from flare_l2evict._b12x.proof import prove_seam
from flare_l2evict._b12x.provider import provider_problem
from flare_l2evict._errors import InstallError

PROVIDER = Path(__file__).resolve().parents[1] / "flare_l2evict" / "_b12x" / "provider.py"
NEEDED = "the plugin needs flashinfer-python>=0.7.2 or b12x>=1.5"

_RUN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_provider", sys.argv[1])
module = sys.modules["_provider"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.provider_problem())
"""


def environment_stand_in(root: Path, packages: dict[str, str], b12x: str | None = None) -> Path:
    """Installed-distribution records for ``packages``; ``b12x``: "package" or "namespace"."""
    for name, version in packages.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if b12x is not None:
        (root / "b12x" / "preparation").mkdir(parents=True)
        if b12x == "package":
            (root / "b12x" / "__init__.py").write_text('"""b12x stand-in"""\n')
    return root


def problem_in(root: Path) -> str:
    run = subprocess.run(
        [sys.executable, "-S", "-c", _RUN, str(PROVIDER)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    return run.stdout.strip()


@pytest.mark.parametrize(
    ("packages", "b12x", "line"),
    [
        ({"torch": "2.13.0"}, None, f"no b12x provider found; {NEEDED}"),
        (
            {"torch": "2.10.0", "flashinfer-python": "0.6.18"},
            None,
            f"flashinfer-python 0.6.18 (ships no b12x), but no importable b12x found; {NEEDED}",
        ),
        (
            {"torch": "2.13.0", "flashinfer-python": "0.7.4"},
            None,
            f"flashinfer-python 0.7.4, but no importable b12x found; {NEEDED}",
        ),
        (
            {"torch": "2.3.1+cu121", "flashinfer-python": "0.7.4"},
            "package",
            "torch 2.3.1+cu121 found; the plugin needs torch>=2.4 "
            "(upgrade torch with the server, or leave the plugin off)",
        ),
        ({"torch": "2.13.0", "b12x": "1.5.1"}, "package", "None"),
        ({"torch": "2.12.0+cu130", "flashinfer-python": "0.7.2rc6"}, "package", "None"),
    ],
)
def test_the_environment_is_named_in_one_line(
    tmp_path: Path, packages: dict[str, str], b12x: str | None, line: str
) -> None:
    assert problem_in(environment_stand_in(tmp_path, packages, b12x)) == line


def test_an_empty_b12x_namespace_is_named_with_its_cause(tmp_path: Path) -> None:
    """What uninstalling flashinfer-python leaves over a standalone b12x: a folder, no __init__."""
    root = environment_stand_in(tmp_path, {"torch": "2.13.0", "b12x": "1.5.1"}, "namespace")
    assert problem_in(root) == (
        f"b12x at {root / 'b12x'} is an empty namespace package (what uninstalling "
        "flashinfer-python leaves over a standalone b12x); the plugin needs "
        "flashinfer-python>=0.7.2 or b12x>=1.5 (reinstall the server's b12x provider)"
    )


def test_the_seam_proof_falls_back_with_that_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """This environment with ``import b12x`` blocked (sys.modules' None stands in for no b12x)."""
    for name in list(sys.modules):
        if name == "b12x" or name.startswith("b12x."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "b12x", None)
    line = provider_problem()
    assert line is not None and "\n" not in line and "no importable b12x" in line
    with pytest.raises(InstallError) as raised:
        prove_seam()
    assert str(raised.value) == line


def test_this_environment_has_no_problem() -> None:
    assert provider_problem() is None


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_start_up_falls_back_with_one_line_naming_it() -> None:
    """The reference host's start-up, ``import b12x`` blocked (None stands in for no b12x)."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['b12x'] = None\n"
            "from flare_l2evict.tools.cli import main\n"
            "raise SystemExit(main(['startup', '--plugin', 'l2evict']))",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stderr[-2000:]  # startup fell back: exit 1 (issue 29)
    flashinfer = importlib.metadata.version("flashinfer-python")
    line = f"flashinfer-python {flashinfer}, but no importable b12x found; {NEEDED}"
    logged = [x for x in run.stderr.splitlines() if "flare_l2evict" in x and line in x]
    assert len(logged) == 1 and logged[0].startswith("WARNING flare_l2evict: stock b12x"), (
        run.stderr[-2000:]
    )
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_torch_is_named_by_the_running_module_not_stale_metadata(tmp_path: Path) -> None:
    # Issue 28: a leftover torch-2.3.1.dist-info on sys.path made the hook fall back.
    stale = tmp_path / "torch-2.3.1.dist-info"
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.3.1\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import torch; "
        "from flare_l2evict._b12x.provider import provider_problem; print(provider_problem())"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "None", shown


def test_a_host_mode_that_refuses_every_call_is_named_as_the_hosts() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    class RefusingModeStandIn(TorchFunctionMode):
        """The host's own mode: it refuses every torch call."""

        def __torch_function__(self, *args: object, **kwargs: object) -> object:
            raise RuntimeError("the host's mode refuses this call")

    with RefusingModeStandIn(), pytest.raises(InstallError) as raised:
        prove_seam()
    text = str(raised.value)
    assert "host's own TorchFunctionMode" in text and "RefusingModeStandIn" in text
    assert "pip install" not in text and "\n" not in text
    assert torch.device("cpu").type == "cpu"  # the mode is the host's: left as it was


def test_a_distribution_whose_metadata_has_no_version_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 41: a b12x dist-info without a Version made the provider's version the string
    # 'None' (str() of a missing field), which `check` and the seam's line then printed.
    from flare_l2evict._b12x import provider

    for name in ("b12x", "flare-l2evict-stand-in"):
        info = tmp_path / f"{name.replace('-', '_')}-0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    b12x, flashinfer = provider.versions()
    assert b12x is None, b12x
    assert flashinfer == importlib.metadata.version("flashinfer-python")  # found as before
    assert provider.installed_version("flare-l2evict-stand-in") is None
    assert provider.installed_version("no-such-distribution-here") is None
    assert provider.installed_version("flashinfer-python") == flashinfer
