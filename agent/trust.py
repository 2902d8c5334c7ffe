"""Path trust for a root daemon (like sshd's StrictModes): a path another user could write, or swap between a
check and an open, is refused. Used for the config file, the store directory, pidfiles and secret files."""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.errors import ConfigError


class UntrustedPath(ConfigError):
    """A path that a user other than root (or the agent's own user) could write."""


class StatFn(Protocol):
    def __call__(self, path: str, /) -> os.stat_result: ...



def check_trusted_path(path: Path, *, what: str, stat: StatFn = os.lstat,
                       readlink: Callable[[str], str] = os.readlink,
                       trusted_uids: frozenset[int] | None = None) -> str:
    """Refuse a path that another user could replace or write: it and every parent directory (through
    symlinks) must be owned by root or by us, and not group/world-writable, except that a sticky parent
    directory such as /tmp is allowed. Missing trailing components pass: their existing parent was checked.

    Returns the absolute path with every (trusted) symlink resolved and the missing tail appended: what
    `open_trusted` walks without following links. A check by path alone is not enough for a root daemon:
    between it and an open, a file in a sticky directory can be removed by its owner and replaced by another
    user's file, symlink or FIFO; `open_trusted` checks what it actually opened.
    """
    trusted = trusted_uids if trusted_uids is not None else frozenset({0, os.geteuid()})
    pending = list(Path(os.path.abspath(path)).parts[1:])
    pending.reverse()
    current = "/"
    _check_one(current, stat(current), final=not pending, path=path, what=what, trusted=trusted)
    hops = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current) or "/"
            continue
        candidate = os.path.join(current, part)
        try:
            st = stat(candidate)
        except FileNotFoundError:
            return os.path.normpath(os.path.join(candidate, *reversed(pending)))
        except OSError as exc:
            raise UntrustedPath(f"refusing {what} {str(path)!r}: cannot stat {candidate!r}: "
                                f"{exc.strerror or exc}") from None
        if stat_mod.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                raise UntrustedPath(f"refusing {what} {str(path)!r}: too many symbolic links")
            if st.st_uid not in trusted:
                raise UntrustedPath(f"refusing {what} {str(path)!r}: symlink {candidate!r} is owned by uid "
                                    f"{st.st_uid}; a root daemon must not take orders from other users")
            link = readlink(candidate)
            if link.startswith("/"):
                current = "/"
            pending.extend(reversed(Path(link).parts[1:] if link.startswith("/") else Path(link).parts))
            continue
        _check_one(candidate, st, final=not pending, path=path, what=what, trusted=trusted)
        current = candidate
    return current


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO put in the file's place returns at once instead of waiting for a writer.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_trusted(path: Path, *, what: str, directory: bool = False, create: bool = False,
                 stat: StatFn = os.lstat, readlink: Callable[[str], str] = os.readlink,
                 trusted_uids: frozenset[int] | None = None) -> int:
    """Open `path` for reading (a regular file, or with `directory` a directory) and return the descriptor,
    after checking what was opened, not only the path.

    The path is checked and its trusted symlinks resolved first (`check_trusted_path`); then every component
    of the resolved path is opened relative to its parent's descriptor with O_NOFOLLOW, and `fstat` of each
    descriptor is checked the same way (owner, group/world-writable, sticky only above the end). A component
    swapped since the path check (another user's file, a symlink, a FIFO) is refused. With `create`, missing
    directories are made (0700) on the way, so a directory another user made in the meantime is refused too.
    OSError (missing file, permission) propagates for the caller to word; UntrustedPath for a refusal.
    """
    trusted = trusted_uids if trusted_uids is not None else frozenset({0, os.geteuid()})
    real = check_trusted_path(path, what=what, stat=stat, readlink=readlink, trusted_uids=trusted)
    parts = [p for p in real.split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    try:
        _check_one("/", os.fstat(fd), final=not parts, path=path, what=what, trusted=trusted)
        walked = ""
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            walked = f"{walked}/{part}"
            flags = _DIR_FLAGS if directory or not last else _FILE_FLAGS
            try:
                child = _open_at(fd, part, flags, mkdir=create and (directory or not last))
            except OSError as exc:
                if exc.errno == errno.ENOTDIR and last and directory and not _is_link_at(fd, part):
                    raise UntrustedPath(f"refusing {what} {str(path)!r}: it is not a directory") from None
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UntrustedPath(f"refusing {what} {str(path)!r}: {walked!r} was replaced (by a symbolic "
                                        f"link or a file) after it was checked") from None
                raise
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            if last and not directory and not stat_mod.S_ISREG(st.st_mode):
                raise UntrustedPath(f"refusing {what} {str(path)!r}: it is not a regular file "
                                    f"({_file_kind(st.st_mode)})")
            _check_one(walked, st, final=last, path=path, what=what, trusted=trusted)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_at(parent: int, name: str, flags: int, *, mkdir: bool) -> int:
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        if not mkdir:
            raise
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass  # made by someone else in the meantime: opened and checked like any other
    return os.open(name, flags, dir_fd=parent)


def _is_link_at(parent: int, name: str) -> bool:
    try:
        return stat_mod.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _file_kind(mode: int) -> str:
    for test, name in ((stat_mod.S_ISFIFO, "a FIFO"), (stat_mod.S_ISSOCK, "a socket"), (stat_mod.S_ISCHR,
                       "a character device"), (stat_mod.S_ISBLK, "a block device"), (stat_mod.S_ISDIR,
                       "a directory")):
        if test(mode):
            return name
    return f"mode {mode:o}"


def _check_one(component: str, st: os.stat_result, *, final: bool, path: Path, what: str,
               trusted: frozenset[int]) -> None:
    mode = st.st_mode
    sticky_dir = stat_mod.S_ISDIR(mode) and bool(mode & stat_mod.S_ISVTX) and not final
    why = None
    if st.st_uid not in trusted:
        why = f"is owned by uid {st.st_uid}"
    elif mode & stat_mod.S_IWOTH and not sticky_dir:
        why = f"is writable by every user (mode {stat_mod.S_IMODE(mode):04o})"
    elif mode & stat_mod.S_IWGRP and st.st_gid != 0 and not sticky_dir:
        why = f"is writable by group {st.st_gid} (mode {stat_mod.S_IMODE(mode):04o})"
    if why:
        subject = "it" if component == os.path.abspath(path) else repr(component)
        raise UntrustedPath(f"refusing {what} {str(path)!r}: {subject} {why}; a root daemon must not take "
                            f"orders from other users (chown root and chmod go-w)")
