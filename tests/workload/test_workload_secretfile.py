"""workload.secretfile: the one secret-file helper (the workload's admin token, the agent's alert secrets)."""

import os
import stat

import pytest

from workload.secretfile import PrivateFileError, read_private, write_secret


def test_written_secret_is_0600_from_creation_and_reads_back(tmp_path):
    path = tmp_path / "token"
    os.umask(old := os.umask(0))  # the most permissive umask: the file must still be 0600
    try:
        write_secret(path, "abc")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_private(path, 16) == b"abc\n"
    assert read_private(path, 2) == b"abc"  # one byte more than allowed: the caller can tell "too large"


@pytest.mark.parametrize(("mode", "forbidden", "refused"), [(0o640, 0o077, True), (0o610, 0o077, True),
                                                             (0o610, 0o066, False), (0o604, 0o066, True)])
def test_the_forbidden_mode_bits_are_the_callers(tmp_path, mode, forbidden, refused):
    path = tmp_path / "secret"
    path.write_bytes(b"s")
    path.chmod(mode)
    if refused:
        with pytest.raises(PrivateFileError) as info:
            read_private(path, 16, forbidden_mode=forbidden)
        assert (info.value.problem, info.value.mode) == ("mode", mode)
    else:
        assert read_private(path, 16, forbidden_mode=forbidden) == b"s"


def test_fifo_symlink_and_stranger_are_refused_by_name(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(PrivateFileError) as info:
        read_private(fifo, 16)  # opened at once (O_NONBLOCK), not waiting for a writer
    assert info.value.problem == "not_regular"
    target = tmp_path / "real"
    target.write_bytes(b"s")
    target.chmod(0o600)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(PrivateFileError) as info:
        read_private(tmp_path / "link", 16)
    assert info.value.problem == "open" and info.value.strerror
    with pytest.raises(PrivateFileError) as info:
        read_private(target, 16, trusted_uids=frozenset({4321}))
    assert (info.value.problem, info.value.uid) == ("owner", os.geteuid())
