"""Waiting for the server's URL: a line that arrives with others in one read must not be missed."""

import subprocess
import sys

import pytest

from workload.launch import LaunchError, await_url

# One write holds a warning and the URL line, then the child stays up and silent: a reader that buffers takes both
# lines in one read, returns the first, and select() then waits on an empty pipe until the deadline.
TWO_LINES_AT_ONCE = ("import os, time; os.write(1, b'WARNING --admin-token is on the command line\\n"
                     "workload: serving tiny on cpu at http://127.0.0.1:8123 (metrics ...)\\n'); time.sleep(30)")


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            bufsize=0)


def test_url_after_a_warning_in_the_same_read_is_found():
    child = _child(TWO_LINES_AT_ONCE)
    try:
        assert await_url(child, timeout_s=10) == "http://127.0.0.1:8123"
    finally:
        child.kill()
        child.wait()


def test_a_child_that_exits_without_a_url_is_an_error_naming_what_it_said():
    child = _child("print('Traceback: no model')")
    with pytest.raises(LaunchError, match="no model"):
        await_url(child, timeout_s=10)
    child.wait()
