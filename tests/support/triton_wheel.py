"""A Triton wheel stand-in for ``scripts/triton_releases.py``: a real, installable-shaped wheel
file that pip can download from a local folder, holding only the files it is given."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path


def triton_wheel_stand_in(folder: Path, version: str, files: Mapping[str, str]) -> Path:
    """``triton-VERSION-cp312-cp312-manylinux_2_28_x86_64.whl`` in ``folder``, with ``files``
    (path in the wheel -> text), a large file the judge must not keep, and the metadata pip
    reads. Returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"triton-{version}-cp312-cp312-manylinux_2_28_x86_64.whl"
    info = f"triton-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("triton/_C/libtriton.so", b"\0" * (1 << 20))
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: triton\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-manylinux_2_28_x86_64\n",
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path
