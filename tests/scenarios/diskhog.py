"""Outside disk contention: a neighbour that writes a large file and fsyncs it, again and again, for SECONDS, in
DIRECTORY (default /var/tmp: the disk the workload's `io` fault writes to, so the server's own fsyncs queue
behind this one's).

    python3 diskhog.py SECONDS [DIRECTORY [MIB_PER_SECOND [CHUNK_MIB [SYNC_MIB [FILE_MIB]]]]]

Writes CHUNK_MIB (4) at a time at MIB_PER_SECOND (128, a backup's pace; unpaced this host's disk took 800),
fsyncs every SYNC_MIB (32) and starts the file over past FILE_MIB (512), so the disk is busy without filling it; the file is unlinked from the start (nothing is left if this is killed). A backup,
a log shipper or a checkpoint writer on the same disk does this to a server that syncs its own small writes.
"""

import os
import sys
import tempfile
import time

from stop_request import StopRequest


def main(seconds: float, directory: str = "/var/tmp", mib_per_second: int = 128, chunk_mib: int = 4,
         sync_mib: int = 32, file_mib: int = 512) -> int:
    if mib_per_second <= 0 or not 0 < chunk_mib <= sync_mib <= file_mib:
        raise SystemExit(f"need 0 < CHUNK_MIB <= SYNC_MIB <= FILE_MIB, and a positive pace, got {chunk_mib}, {sync_mib}, {file_mib}, {mib_per_second}")
    stop = StopRequest()
    payload = os.urandom(chunk_mib << 20)  # not zeros: nothing on the way may compress or skip them
    fd, path = tempfile.mkstemp(prefix="infersight-diskhog-", dir=directory)
    os.unlink(path)
    began = time.monotonic()
    deadline = began + seconds
    size = unsynced = synced = written_all = 0
    try:
        while not stop.requested and time.monotonic() < deadline:
            if size >= file_mib << 20:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                size = 0
            ahead = written_all / (mib_per_second << 20) - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
            written = os.write(fd, payload)
            written_all += written
            size += written
            unsynced += written
            if unsynced >= sync_mib << 20:
                os.fsync(fd)
                synced += unsynced
                unsynced = 0
    finally:
        os.close(fd)
    print(f"wrote and synced {synced >> 20} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), *sys.argv[2:3], *(int(a) for a in sys.argv[3:7])))
