"""This installation's own wheel, so that a launched machine runs the server's exact code.

The server packs the ``lakeshore`` package it runs from (every file but bytecode) with its
installed distribution's metadata into a ``py3-none-any`` wheel, once per process, in
memory. The wheel is reproducible: files in sorted order, one fixed timestamp, fixed
modes, so several replicas running the same code serve the same bytes and the checksum a
start-up script was written with (by one replica) holds for the wheel it downloads (from
any). Launched machines fetch it from ``GET /v1/dist/{filename}`` and check its SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import stat
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from wheel.wheelfile import WheelFile

import lakeshore
from lakeshore.defaults import DIST_NAME

WHEEL_TAG = "py3-none-any"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: every entry the same, for one checksum
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class Wheel:
    filename: str
    version: str
    sha256: str
    data: bytes


class _ReproducibleWheel(WheelFile):  # type: ignore[misc]  # untyped
    """A ``WheelFile`` whose every entry, RECORD included, has one timestamp and mode."""

    def writestr(
        self,
        zinfo_or_arcname: str | zipfile.ZipInfo,
        data: bytes | str,
        compress_type: int | None = None,
    ) -> None:
        if isinstance(zinfo_or_arcname, str):
            zinfo_or_arcname = _entry(zinfo_or_arcname)
        super().writestr(zinfo_or_arcname, data, compress_type)


def _entry(arcname: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(arcname, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o644 | stat.S_IFREG) << 16
    return info


def _package_files(root: Path) -> list[tuple[Path, str]]:
    """The package's files with their names in the wheel, in a fixed order."""
    found = []
    for path in root.rglob("*"):
        relative = path.relative_to(root.parent)
        if (
            path.is_file()
            and not _SKIP_DIRS.intersection(relative.parts)
            and not path.name.endswith(_SKIP_SUFFIXES)
        ):
            found.append((path, relative.as_posix()))
    return sorted(found, key=lambda item: item[1])


def _metadata(dist: importlib.metadata.Distribution) -> dict[str, str]:
    """The dist-info files a wheel of this distribution carries (RECORD comes last)."""
    files = {
        "METADATA": dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {DIST_NAME}\n",
        "WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: lakeshore\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
        ),
    }
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        files["entry_points.txt"] = entry_points
    return files


def build() -> Wheel:
    """Pack the running ``lakeshore`` package into a wheel (a few hundred kB, ~0.2 s)."""
    dist = importlib.metadata.distribution(DIST_NAME)
    version = dist.version
    filename = f"{DIST_NAME.replace('-', '_')}-{version}-{WHEEL_TAG}.whl"
    dist_info = f"{DIST_NAME.replace('-', '_')}-{version}.dist-info"
    with tempfile.TemporaryDirectory(prefix="lakeshore-wheel-") as scratch:
        target = Path(scratch) / filename  # WheelFile reads the name and version from it
        with _ReproducibleWheel(target, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
            for path, arcname in _package_files(Path(lakeshore.__file__).parent):
                wheel.writestr(_entry(arcname), path.read_bytes())
            for name, text in _metadata(dist).items():
                wheel.writestr(_entry(f"{dist_info}/{name}"), text)
        data = target.read_bytes()
    return Wheel(filename, version, hashlib.sha256(data).hexdigest(), data)


_lock = threading.Lock()
_built: Wheel | None = None


def own_wheel() -> Wheel:
    """This process's wheel, built on first use (thread-safe; call it off the event loop)."""
    global _built
    with _lock:
        if _built is None:
            _built = build()
        return _built
