"""Server and client of the delivery probe's ground-truth test, each run in its own network namespace.

    python -m tests.probes.delivery_peers server PORT
    python -m tests.probes.delivery_peers client HOST PORT CONNECTIONS REQUESTS SIZE INTERVAL [--delayed-ack]
    python -m tests.probes.delivery_peers idle HOST PORT CONNECTIONS    # one small reply each, then idle
    python -m tests.probes.delivery_peers stall HOST PORT SIZE          # asks for SIZE bytes, never reads
    python -m tests.probes.delivery_peers early HOST PORT CONNECTIONS DELAY  # a pool: connect, DELAY s, request

Request: "ID SIZE\\n". Reply: SIZE bytes, the last one "\\n". The server prints "w ID T" after each reply is
written (T: CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns); the client prints "r ID T" when it holds a
reply's last byte, "c FIRST NS T" after each connect (its duration, its end), and "s ID T" as each connection's
first request leaves. Unless --delayed-ack, the client asks for an immediate ACK (TCP_QUICKACK) before each read,
so that its kernel's ACK goes out when the bytes arrive, not on its delayed-ACK timer.
"""

from __future__ import annotations

import socket
import sys
import threading
import time


def _serve(conn: socket.socket, lock: threading.Lock) -> None:
    with conn:
        buf = b""
        while True:
            while b"\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            line, _, buf = buf.partition(b"\n")
            ident, size = (int(x) for x in line.split())
            conn.sendall(b"x" * (size - 1) + b"\n")
            now = time.monotonic_ns()
            with lock:
                print(f"w {ident} {now}", flush=True)


def server(port: int) -> None:
    lock = threading.Lock()
    with socket.create_server(("0.0.0.0", port), backlog=128) as listener:
        print("ready", flush=True)
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_serve, args=(conn, lock), daemon=True).start()


def _client_conn(host: str, port: int, first: int, requests: int, size: int, interval: float, quickack: bool,
                 lock: threading.Lock) -> None:
    t0 = time.monotonic_ns()
    with socket.create_connection((host, port), timeout=120) as conn:
        end = time.monotonic_ns()
        with lock:
            print(f"c {first} {end - t0} {end}", flush=True)  # connect's duration, ns, and its end
        for ident in range(first, first + requests):
            if ident == first:
                with lock:
                    print(f"s {ident} {time.monotonic_ns()}", flush=True)  # the first request leaves
            conn.sendall(f"{ident} {size}\n".encode())
            got = 0
            while got < size:
                if quickack:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                chunk = conn.recv(65536)
                if not chunk:
                    raise SystemExit(f"server closed the connection after {got} of {size} bytes")
                got += len(chunk)
            now = time.monotonic_ns()
            with lock:
                print(f"r {ident} {now}", flush=True)
            time.sleep(interval)


def client(host: str, port: int, connections: int, requests: int, size: int, interval: float,
           quickack: bool) -> None:
    lock = threading.Lock()
    threads = [threading.Thread(target=_client_conn,
                                args=(host, port, i * requests, requests, size, interval, quickack, lock))
               for i in range(connections)]
    for t in threads:
        t.start()
        time.sleep(interval / connections)
    for t in threads:
        t.join()
    print("done", flush=True)


def _early_conn(host: str, port: int, ident: int, delay: float, lock: threading.Lock) -> None:
    with socket.create_connection((host, port), timeout=60) as conn:
        time.sleep(delay)
        with lock:
            print(f"s {ident} {time.monotonic_ns()}", flush=True)
        conn.sendall(f"{ident} 100\n".encode())
        got = 0
        while got < 100:
            chunk = conn.recv(4096)
            if not chunk:
                raise SystemExit(f"server closed the connection after {got} of 100 bytes")
            got += len(chunk)


def early(host: str, port: int, connections: int, delay: float) -> None:
    """A pool that connects ahead of use: CONNECTIONS connections opened at once, each sending its first request
    DELAY seconds after its handshake (one small request and reply each)."""
    lock = threading.Lock()
    threads = [threading.Thread(target=_early_conn, args=(host, port, i, delay, lock)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done", flush=True)


def idle(host: str, port: int, connections: int) -> None:
    """Keep-alive connections that each got one reply and then say nothing until stdin closes."""
    conns = []
    for ident in range(connections):
        conn = socket.create_connection((host, port), timeout=60)
        conn.sendall(f"{ident} 100\n".encode())
        got = 0
        while got < 100:
            got += len(conn.recv(4096))
        conns.append(conn)
    print("idle", flush=True)
    sys.stdin.read()
    for conn in conns:
        conn.close()


def stall(host: str, port: int, size: int) -> None:
    """A client that asks for a large reply and never reads it: its receive window closes (zero window)."""
    conn = socket.create_connection((host, port), timeout=60)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.sendall(f"0 {size}\n".encode())
    print("stalled", flush=True)
    sys.stdin.read()
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    elif sys.argv[1] == "idle":
        idle(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "early":
        early(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    elif sys.argv[1] == "stall":
        stall(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        host, port, conns, reqs, size, interval = sys.argv[2:8]
        client(host, int(port), int(conns), int(reqs), int(size), float(interval), "--delayed-ack" not in sys.argv)
