"""The admin token: read from a file only its owner (root or the server's user) can read, and gone from the server's
environment once read, so nothing the server starts inherits it."""

import os
from pathlib import Path

import pytest

from workload.client import debug, set_fault
from workload.launch import launched_server
from workload.tokenfile import TokenFileError, read_token_file


def _token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    path.chmod(mode)
    return path


def test_token_file_of_root_or_this_user_and_mode_0600_is_read(tmp_path):
    assert read_token_file(_token_file(tmp_path)) == "s3cret-token"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_token_file_open_to_group_or_others_is_refused(tmp_path, mode):
    with pytest.raises(TokenFileError, match=rf"readable by other users \(mode 0{mode:o}\); chmod 600"):
        read_token_file(_token_file(tmp_path, mode))


def test_token_file_owned_by_another_user_is_refused(require_root, tmp_path):
    # Fails before the owner check: a 0600 file of another user passed, and root read that user's token.
    path = _token_file(tmp_path)
    os.chown(path, 65534, 65534)
    with pytest.raises(TokenFileError, match=r"is owned by uid 65534, not by root or this user \(uid 0\); chown it"):
        read_token_file(path)


def test_token_file_that_is_a_fifo_or_a_symlink_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(TokenFileError, match="is not a regular file"):
        read_token_file(fifo)  # before O_NONBLOCK, this open waited for a writer
    link = tmp_path / "link"
    link.symlink_to(_token_file(tmp_path))
    with pytest.raises(TokenFileError, match="cannot read token file"):
        read_token_file(link)


SECRET = "env-token-0123456789abcdef"


@pytest.mark.workload
def test_token_from_the_environment_is_not_inherited_by_what_the_server_starts():
    # Fails before serve.py drops the variable: every cpuhog process the server started carried the admin token
    # in its environment.
    with launched_server(token=SECRET) as server:
        set_fault(server.url, "cpuhog", True, server.token)  # the token it read still works
        try:
            pids = debug(server.url, server.token)["cpuhog_pids"]
            assert pids
            for pid in pids:
                assert SECRET.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), f"cpuhog {pid} has the token"
        finally:
            set_fault(server.url, "cpuhog", False, server.token)
        # What no process can change about itself: the kernel keeps the environment it started with
        # (docs/security.md, rule 3). This is why the demo hands the token over in a file.
        assert SECRET.encode() in Path(f"/proc/{server.proc.pid}/environ").read_bytes()
