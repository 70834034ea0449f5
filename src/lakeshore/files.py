"""Files and directories a server keeps on disk are its user's alone, whatever the umask.

The data dir holds the admin token and, by default, the SQLite store: every argument and
result of every namespace. So a directory Lakeshore creates is 0700 (the missing parents
too), and the SQLite file is 0600 — made so before SQLite first opens it, because SQLite
gives the ``-wal`` and ``-shm`` files it creates the database file's own mode. Modes are
set with ``chmod`` after creating, since ``mkdir``/``open`` modes are cut by the umask
(0777 under ``umask 000`` is how this started); until then a new entry is never looser
than intended. An existing directory is left as it is (it may be the user's own); an
existing SQLite file (or its ``-wal``/``-shm``) of this user's that others can read is
tightened to 0600.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
SQLITE_SIDE_FILES: Final = ("-wal", "-shm")


def private_dir(path: Path) -> None:
    """Make sure ``path`` is a directory; the ones this creates are 0700."""
    if path.is_dir():
        return
    missing = [path, *(p for p in path.parents if not p.exists())]
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else (another server): theirs to keep
        os.chmod(folder, DIR_MODE)


def _tighten(path: Path) -> None:
    try:
        found = path.stat()
    except FileNotFoundError:
        return
    if found.st_uid == os.getuid() and found.st_mode & 0o077:
        os.chmod(path, FILE_MODE)


def private_sqlite_file(path: Path) -> None:
    """Create the SQLite file ``path`` 0600 if it is missing (an empty file is an empty
    database), and tighten an existing one and its ``-wal``/``-shm`` files to 0600."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        _tighten(path)
    else:
        try:
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
    for suffix in SQLITE_SIDE_FILES:
        _tighten(path.with_name(path.name + suffix))
