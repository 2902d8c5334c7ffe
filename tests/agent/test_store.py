"""Store: round trips, kill -9 during writes, migrations from an older schema, retention, threads."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.config import UntrustedPath
from agent.store import (
    MIGRATIONS,
    Migration,
    Store,
    StoreError,
    decode_folded,
    encode_folded,
)
from analysis.window import (
    GcReading,
    GpuReading,
    LatencyReading,
    Log2Histogram,
    OffCpuReading,
    ProcessReading,
    StackReading,
    SyscallReading,
    TcpFlow,
    TcpReading,
    Window,
)


def make_window(i: int, target: str = "t", stacks: int = 3) -> Window:
    """Window number i: every field derived from i, so any stored copy can be checked exactly."""
    start = 1000.0 + 5 * i
    return Window(
        target=target, pid=4000 + i // 10, start=start, end=start + 5,
        syscalls=SyscallReading(counts={"read": i, "futex": 2 * i},
                                latency={"read": Log2Histogram(unit="ns", counts=[0, i, 1])}),
        offcpu=OffCpuReading(seconds=0.5 * i, by_thread={7: 0.25 * i},
                             histogram=Log2Histogram(unit="us", counts=[1, 2, i]),
                             stacks={f"schedule;futex_wait;k{j}": 10 * i + j for j in range(stacks)}),
        gc=GcReading(collections=i, pause_seconds=0.001 * i, max_pause_seconds=0.001),
        tcp=TcpReading(retransmits=i % 3, flows=[TcpFlow("10.0.0.1", 8000, "10.0.0.2", 5555, "ESTABLISHED", 1)]),
        process=ProcessReading(cpu_seconds=1.5, rss_bytes=1 << 20, threads=4, fds=10 + i),
        stacks=StackReading(active={f"MainThread;serve (srv.py:{i});fwd (m.py:{j})": j + 1 for j in range(stacks)},
                            idle={f"Worker;wait (q.py:{j})": 2 for j in range(stacks)}, rate_hz=49.0),
        latency=LatencyReading(p50_seconds=0.01, p95_seconds=0.02 + i / 1000, p99_seconds=0.05, requests=100,
                               request_rate=20.0),
        gpu=GpuReading(available=False, reason="no GPU"),
        errors={"gc": "unsupported"} if i % 2 else {},
    )


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def test_round_trip_queries_and_profiles(store_dir: Path) -> None:
    with Store.open(store_dir) as s:
        ids = [s.add_window(make_window(i, target="a" if i % 2 == 0 else "b")) for i in range(10)]
        assert ids == sorted(ids) and len(set(ids)) == 10
        assert s.windows() == [make_window(i, target="a" if i % 2 == 0 else "b") for i in range(10)]
        assert s.windows(target="a") == [make_window(i, "a") for i in range(0, 10, 2)]
        assert s.windows(target="a", limit=2) == [make_window(6, "a"), make_window(8, "a")]
        # Overlap semantics: window 2 spans [1010, 1015), window 4 [1020, 1025).
        assert [w.start for w in s.windows(since=1012, until=1021)] == [1010.0, 1015.0, 1020.0]
        assert s.latest("b") == make_window(9, "b") and s.latest("zzz") is None
        bare = s.windows(target="a", limit=1, with_profiles=False)[0]
        assert bare.stacks.active == {} and bare.offcpu.stacks == {} and bare.stacks.rate_hz == 49.0
        assert [(t.name, t.windows, t.first_start, t.last_end) for t in s.targets()] == [
            ("a", 5, 1000.0, 1045.0), ("b", 5, 1005.0, 1050.0)]
        active = s.profiles("a", kind="active")
        expected: dict[str, int] = {}
        for i in range(0, 10, 2):
            for k, v in make_window(i).stacks.active.items():
                expected[k] = expected.get(k, 0) + v
        assert active == expected
        assert s.profiles("a", since=1000, until=1005, kind="offcpu") == make_window(0).offcpu.stacks
        assert s.profiles("b", kind="idle") == {f"Worker;wait (q.py:{j})": 10 for j in range(3)}
        with pytest.raises(ValueError, match="profile kind must be one of active, idle, offcpu, got 'cpu'"):
            s.profiles("a", kind="cpu")


def test_window_without_stacks_and_profiles_are_compressed(store_dir: Path) -> None:
    w = Window(target="x", pid=1, start=1.0, end=2.0, errors={"stacks": "py-spy not running"})
    with Store.open(store_dir) as s:
        s.add_window(w)
        big = make_window(1, stacks=2000)
        wid = s.add_window(big)
        assert s.windows() == [w, big]
        (stored,) = s._reader().execute("SELECT SUM(length(folded)) FROM profiles WHERE window_id = ?", (wid,))
        raw = sum(len(f"{k} {v}\n") for k, v in big.stacks.active.items())
        assert stored[0] < raw / 3, (stored[0], raw)
    assert decode_folded(encode_folded({"a;b c": 3, "a": 1})) == {"a;b c": 3, "a": 1}


def test_store_is_wal_full_and_dir_is_private(store_dir: Path) -> None:
    with Store.open(store_dir) as s:
        conn = s._reader()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
        assert s.schema_version() == len(MIGRATIONS)
    assert (store_dir.stat().st_mode & 0o777) == 0o700


def test_world_writable_store_dir_is_refused(store_dir: Path) -> None:
    store_dir.mkdir()
    store_dir.chmod(0o777)
    with pytest.raises(UntrustedPath, match=rf"refusing store directory '{store_dir}': it is writable by every user"):
        Store.open(store_dir)



@pytest.mark.parametrize("made", ["directory", "symlink"])
def test_store_dir_made_by_another_user_after_the_check_is_refused(require_root, tmp_path: Path, monkeypatch,
                                                                   made: str) -> None:
    # Fails before open_store_dir: the missing directory passed the path check, another user made it (or a
    # symlink to one of theirs) before mkdir(exist_ok=True), and the root agent wrote its history there.
    import agent.store
    import agent.trust

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    store_dir = sticky / "infersight"
    theirs = tmp_path / "theirs"
    checked = agent.trust.check_trusted_path

    def check_then_race(path, **kw):
        result = checked(path, **kw)
        if not os.path.lexists(store_dir):  # the other user, right after the check
            if made == "directory":
                store_dir.mkdir(mode=0o777)
                os.chown(store_dir, 65534, 65534)
            else:
                theirs.mkdir(mode=0o777)
                os.chown(theirs, 65534, 65534)
                store_dir.symlink_to(theirs)
                os.chown(store_dir, 65534, 65534, follow_symlinks=False)
        return result

    monkeypatch.setattr(agent.trust, "check_trusted_path", check_then_race)
    monkeypatch.setattr(agent.store, "check_trusted_path", check_then_race, raising=False)
    why = "it is owned by uid 65534" if made == "directory" else "was replaced"
    with pytest.raises(UntrustedPath, match=rf"refusing store directory '{store_dir}': .*{why}"):
        Store.open(store_dir).close()
    assert not any(p.name.startswith("infersight.db") for p in (theirs.iterdir() if theirs.exists() else [])), \
        "the history was written into another user's directory"


def test_store_dir_through_a_trusted_symlink_opens_the_real_one(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    with Store.open(tmp_path / "link") as s:
        assert s.path == real / "infersight.db"
    assert (real / "infersight.db").exists() and (real.stat().st_mode & 0o777) == 0o700


# ---- kill -9 ------------------------------------------------------------------------------------------

CHILD = r"""
import importlib.util, sys
from pathlib import Path
from agent.store import Store
spec = importlib.util.spec_from_file_location("store_test_windows", sys.argv[3])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
make_window = module.make_window
s = Store.open(Path(sys.argv[1]))
i = int(sys.argv[2])
print("ready", flush=True)
while True:
    window = make_window(i, stacks=400)
    print("begin", i, flush=True)
    wid = s.add_window(window)
    print(wid, i, flush=True)
    i += 1
"""


def _run_and_kill(store_dir: Path, first: int, min_commits: int, rng: random.Random) -> tuple[dict[int, int], bool]:
    """Start a writer, read its committed ids, SIGKILL it; returns ({id: window number}, whether the kill
    landed inside add_window(): a 'begin' line with no id line after it)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(store_dir), str(first), __file__],
                             stdout=subprocess.PIPE, text=True)
    committed: dict[int, int] = {}
    try:
        assert child.stdout.readline() == "ready\n"
        target = min_commits + rng.randrange(20)
        while len(committed) < target:
            wid, i = child.stdout.readline().split()
            if wid != "begin":
                committed[int(wid)] = int(i)
        # The writer spends nearly all its time inside add_window(); a random pause spreads the kill
        # over the phases of the next write (encode, insert, commit, fsync).
        time.sleep(rng.random() * 0.005)
        assert child.poll() is None, "the writer stopped on its own: it was not killed mid-run"
        child.send_signal(signal.SIGKILL)
        # Lines already in the pipe are commits that returned before the kill.
        last = ""
        for line in child.stdout.read().splitlines():
            parts = line.split()
            if len(parts) == 2:
                last = parts[0]
                if parts[0] != "begin":
                    committed[int(parts[0])] = int(parts[1])
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return committed, last == "begin"


def test_kill_9_during_writes_loses_no_committed_window_and_history_continues(store_dir: Path) -> None:
    rng = random.Random(5)
    Store.open(store_dir).close()
    all_committed: dict[int, int] = {}
    mid_write = 0
    # About 3 in 4 kills land inside add_window() (measured); six rounds miss it with p < 0.001.
    for _ in range(6):
        with Store.open(store_dir) as s:
            stored = s.windows(with_profiles=False)
            next_i = int((stored[-1].start - 1000) // 5) + 1 if stored else 0
        committed, in_flight = _run_and_kill(store_dir, next_i, 15, rng)
        all_committed.update(committed)
        mid_write += in_flight
    # The writer spends nearly all its time in add_window(); if no kill landed there the test proved nothing.
    assert mid_write >= 1, "no SIGKILL landed inside add_window()"

    with Store.open(store_dir) as s:
        assert s._reader().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = dict(s._reader().execute("SELECT id, start FROM windows").fetchall())
        for wid, i in all_committed.items():
            assert rows.get(wid) == make_window(i).start, f"committed window id {wid} (#{i}) lost"
        windows = s.windows()
        # Every stored window, including one committed just before the kill and never printed, is whole.
        numbers = [int((w.start - 1000) // 5) for w in windows]
        assert windows == [make_window(i, stacks=400) for i in numbers]
        # Restarts continue the history: consecutive numbers, no gap, no duplicate.
        assert numbers == list(range(len(numbers)))
        assert len(numbers) >= len(all_committed) >= 6 * 15
        # A restarted agent appends after what it finds.
        wid = s.add_window(make_window(len(numbers), stacks=400))
        assert wid > max(rows) and s.latest("t") == make_window(len(numbers), stacks=400)


# ---- migrations ---------------------------------------------------------------------------------------

N = len(MIGRATIONS)
FIRST = MIGRATIONS[:1]  # the schema of the first release: every later migration must carry its data forward
LATER = (
    Migration(N + 1, "later tables", """
        CREATE TABLE later_findings (
            id INTEGER PRIMARY KEY,
            target_id INTEGER NOT NULL REFERENCES targets(id),
            window_id INTEGER REFERENCES windows(id),
            data TEXT NOT NULL
        );
    """),
    Migration(N + 2, "later outbox", """
        CREATE TABLE later_outbox (id INTEGER PRIMARY KEY, finding_id INTEGER NOT NULL, sent_at REAL);
        CREATE INDEX later_outbox_unsent ON later_outbox(sent_at);
    """),
)


def test_migration_from_older_schema_keeps_data(store_dir: Path) -> None:
    with Store.open(store_dir, migrations=FIRST) as s:
        for i in range(5):
            s.add_window(make_window(i))
        assert s.schema_version() == 1
    with Store.open(store_dir, migrations=MIGRATIONS + LATER) as s:
        assert s.schema_version() == N + 2
        assert s.windows() == [make_window(i) for i in range(5)]
        conn = s._reader()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"targets", "windows", "profiles", "later_findings", "later_outbox", "schema_version"} <= tables
        assert [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")] == \
            list(range(1, N + 3))
        s.add_window(make_window(5))
    # Opening again runs nothing: versions stay, data stays.
    with Store.open(store_dir, migrations=MIGRATIONS + LATER) as s:
        assert s.schema_version() == N + 2 and len(s.windows()) == 6


def test_failed_migration_rolls_back_whole(store_dir: Path) -> None:
    Store.open(store_dir).close()
    broken = Migration(N + 1, "half broken", "CREATE TABLE later_findings (id INTEGER PRIMARY KEY);\n"
                                             "CREATE TABLE windows (id INTEGER);")
    with pytest.raises(StoreError, match=rf"migration {N + 1} \(half broken\) failed: table windows already exists"):
        Store.open(store_dir, migrations=MIGRATIONS + (broken,))
    with Store.open(store_dir) as s:
        assert s.schema_version() == N
        assert s._reader().execute("SELECT name FROM sqlite_master WHERE name = 'later_findings'").fetchone() is None


def test_newer_schema_is_refused_and_bad_numbering_rejected(store_dir: Path) -> None:
    Store.open(store_dir, migrations=MIGRATIONS + LATER).close()
    with pytest.raises(StoreError, match=rf"has schema version {N + 2}, newer than this infersight knows \({N}\)"):
        Store.open(store_dir)
    with pytest.raises(StoreError, match=r"numbered 1..N in order, got \[1, 3\]"):
        Store.open(store_dir, migrations=FIRST + (dataclasses.replace(LATER[1], version=3),))


def test_not_a_database_is_a_store_error(store_dir: Path) -> None:
    store_dir.mkdir(mode=0o700)
    (store_dir / "infersight.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open store .*file is not a database"):
        Store.open(store_dir)


# ---- retention ----------------------------------------------------------------------------------------

def test_retention_by_age_deletes_old_windows_and_their_profiles(store_dir: Path) -> None:
    with Store.open(store_dir) as s:
        for i in range(20):
            s.add_window(make_window(i))
        # Window i ends at 1005 + 5i; keep those ending at or after now - max_age = 1050 (i >= 9).
        r = s.apply_retention(now=1100.0, max_age_s=50.0, max_bytes=1 << 30)
        assert r.deleted_windows == 9
        assert [w.start for w in s.windows()] == [make_window(i).start for i in range(9, 20)]
        conn = s._reader()
        assert conn.execute("SELECT COUNT(*) FROM profiles").fetchone()[0] == 11 * 3
        assert conn.execute("SELECT COUNT(*) FROM profiles WHERE window_id NOT IN (SELECT id FROM windows)"
                            ).fetchone()[0] == 0
        assert s.apply_retention(1100.0, 50.0, 1 << 30).deleted_windows == 0


def test_retention_uses_the_injected_clock_and_no_size_limit_by_default(store_dir: Path) -> None:
    with Store.open(store_dir, clock=lambda: 1100.0) as s:
        for i in range(20):
            s.add_window(make_window(i))
        assert s.apply_retention().deleted_windows == 0  # no age, no size limit: keep everything
        assert s.apply_retention(max_age_s=50.0).deleted_windows == 9
        assert len(s.windows()) == 11


def test_retention_by_size_keeps_newest_and_shrinks_the_file(store_dir: Path) -> None:
    rng = random.Random(1)
    with Store.open(store_dir) as s:
        for i in range(60):
            w = make_window(i, stacks=0)
            # Random frame names compress poorly, so the file really grows (~40 KB per window).
            w.stacks.active = {f"m;{rng.getrandbits(256):064x}": 1 for _ in range(1000)}
            s.add_window(w)
        s._write.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = s.size_bytes()
        assert before > 2_000_000, before
        limit = 1_000_000
        r = s.apply_retention(now=0.0, max_age_s=1e12, max_bytes=limit)
        assert r.bytes_before >= before and r.bytes_after == s.size_bytes()
        assert s.size_bytes() <= limit, (s.size_bytes(), limit)
        assert os.path.getsize(s.path) <= limit
        kept = [int((w.start - 1000) // 5) for w in s.windows(with_profiles=False)]
        assert kept == list(range(60 - len(kept), 60)) and 10 <= len(kept) < 30, kept
        assert r.deleted_windows == 60 - len(kept)


# ---- threads ------------------------------------------------------------------------------------------

def test_one_writer_and_reading_threads(store_dir: Path) -> None:
    s = Store.open(store_dir)
    errors: list[BaseException] = []
    done = threading.Event()
    n = 80

    def reader() -> None:
        seen = 0
        try:
            while not done.is_set():
                count = len(s.windows(target="t", with_profiles=False))
                assert count >= seen, (count, seen)
                seen = count
                latest = s.latest("t")
                if latest is not None:
                    assert latest == make_window(int((latest.start - 1000) // 5))
        except (AssertionError, sqlite3.Error, StoreError) as exc:  # the main thread fails the test with it
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for i in range(n):
            s.add_window(make_window(i))
    finally:
        done.set()
        for t in readers:
            t.join(timeout=60)
    assert not errors, errors[0]
    assert len(s.windows()) == n
    s.close()
    with pytest.raises(StoreError, match="is closed"):
        s.windows()


def test_two_processes_reading_while_one_writes(store_dir: Path) -> None:
    with Store.open(store_dir) as writer, Store.open(store_dir) as reader:
        writer.add_window(make_window(0))
        assert reader.windows() == [make_window(0)]
        # A reader holding an open read transaction still sees its snapshot, and never blocks the writer.
        conn = reader._reader()
        conn.execute("BEGIN")
        assert conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 1
        writer.add_window(make_window(1))
        assert conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 1
        conn.execute("COMMIT")
        assert len(reader.windows()) == 2


def test_sqlite_file_is_readable_by_plain_sqlite3(store_dir: Path) -> None:
    with Store.open(store_dir) as s:
        s.add_window(make_window(3))
    conn = sqlite3.connect(store_dir / "infersight.db")
    (data,) = conn.execute("SELECT data FROM windows").fetchone()
    assert '"target":"t"' in data and "active" not in data  # stacks live in profiles, not twice
    conn.close()


def test_retention_on_another_thread_while_writing_and_reading(store_dir: Path) -> None:
    s = Store.open(store_dir)
    errors: list[BaseException] = []
    done = threading.Event()

    def retention() -> None:
        try:
            while not done.is_set():
                s.apply_retention(now=1000.0 + 5 * 60, max_age_s=5 * 20)  # keep windows ending in the last 100 s
        except (AssertionError, sqlite3.Error, StoreError) as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while not done.is_set():
                for w in s.windows(with_profiles=True):
                    assert w == make_window(int((w.start - 1000) // 5))
        except (AssertionError, sqlite3.Error, StoreError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=retention), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        for i in range(60):
            s.add_window(make_window(i))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors[0]
    s.apply_retention(now=1000.0 + 5 * 60, max_age_s=5 * 20)
    # Window i ends at 1005 + 5i; those ending at or after 1200 survive: i >= 39.
    assert [int((w.start - 1000) // 5) for w in s.windows()] == list(range(39, 60))
    s.close()


def test_store_files_are_0600_whatever_the_directory_mode(tmp_path):
    import stat as stat_mod

    directory = tmp_path / "store"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    old = os.umask(0o022)
    try:
        with Store.open(directory) as s:
            s.add_window(make_window(0, "a"))
            modes = {p.name: stat_mod.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
    finally:
        os.umask(old)
    assert modes and all(m == 0o600 for m in modes.values()), {k: oct(v) for k, v in modes.items()}


def test_profile_reads_are_bounded_while_reading(store_dir: Path) -> None:
    from analysis.flamegraph.profile import TRUNCATED, Limits
    from analysis.flamegraph.stored import from_store

    with Store.open(store_dir) as s:
        for i in range(10):
            s.add_window(make_window(i))  # 3 active stacks of 1, 2 and 3 samples, new names in every window
        full = s.read_profiles("t")
        assert (full.windows, len(full.stacks), full.cut, full.read_from) == (10, 30, None, None)
        capped = s.read_profiles("t", max_stacks=7)
        # Newest first: the stacks kept are the newest windows'; the rest are counted, samples included.
        assert len(capped.stacks) == 7 and {k.split("srv.py:")[1][0] for k in capped.stacks} == {"7", "8", "9"}
        assert capped.dropped_stacks == 23 and sum(capped.stacks.values()) + capped.dropped_samples == 60
        # The newest 12 s of an open range: windows ending after 1050 - 12 = 1038, and it says so.
        spanned = s.read_profiles("t", max_span=12.0)
        assert (spanned.windows, spanned.cut, spanned.read_from) == (3, "span", 1038.0)
        assert s.read_profiles("t", since=1036.0, max_span=100.0).cut is None, "nothing older was left out"
        # A clock that moves one tick per look: the read stops at the deadline, having read 4 windows.
        ticks = iter(range(100))
        timed = s.read_profiles("t", deadline=3, clock=lambda: next(ticks))
        assert (timed.windows, timed.cut, timed.read_from) == (4, "time", 1030.0)

        prof = from_store(s, "t", None, None, "active", max_span=12.0, limits=Limits(max_stacks=7))
        # Windows 7-9 hold 9 stacks and 18 samples: 7 kept, 2 (5 samples) under [truncated], none lost.
        assert prof.total() == 18 and prof.stacks[(TRUNCATED,)] == 5
        assert (prof.truncation.dropped_stacks, prof.truncation.dropped_samples) == (2, 5)
        assert prof.truncation.range_cut == "the range limit" and prof.start == 1038.0 and prof.truncation.any()


def test_store_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("")
    with pytest.raises(UntrustedPath, match=r"refusing store directory '.*store': it is not a directory$"):
        Store.open(tmp_path / "store")
