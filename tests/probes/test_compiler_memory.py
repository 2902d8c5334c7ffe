"""BCC's compiler leaves ~70 MiB of LLVM code resident after a probe compiles; load_bpf drops it."""

import json
import subprocess
import sys
import textwrap

from probes.base import CodeMapping, compiler_code_mappings

SMAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 fe:01 1 /usr/bin/python3.11
Rss:                   4 kB
Anonymous:             0 kB
7f0000000000-7f0004000000 r-xp 00a00000 fe:01 2 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:              65536 kB
Rss:               40960 kB
Pss:               40960 kB
Anonymous:             0 kB
7f0004000000-7f0004100000 r--p 04a00000 fe:01 2 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                1024 kB
Anonymous:             0 kB
7f0005000000-7f0006000000 r-xp 00100000 fe:01 3 /usr/lib/x86_64-linux-gnu/libclang-cpp.so.14
Rss:               12288 kB
Anonymous:             8 kB
7f0007000000-7f0007001000 r-xp 00000000 fe:01 4 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   4 kB
Anonymous:             0 kB
7f0008000000-7f0008001000 rw-p 00000000 00:00 0
Rss:                   4 kB
Anonymous:             4 kB
"""


def test_only_the_compilers_executable_mappings_are_found() -> None:
    found = compiler_code_mappings(SMAPS)
    assert found == [
        CodeMapping(0x7F0000000000, 0x7F0004000000, "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",
                    rss_bytes=40960 * 1024, anonymous_bytes=0),
        CodeMapping(0x7F0005000000, 0x7F0006000000, "/usr/lib/x86_64-linux-gnu/libclang-cpp.so.14",
                    rss_bytes=12288 * 1024, anonymous_bytes=8 * 1024),
    ]


def test_a_library_not_named_is_left_alone() -> None:
    assert compiler_code_mappings(SMAPS, libraries=("libfoo",)) == []
    assert compiler_code_mappings("") == []


# Runs in a fresh interpreter: the suite's own process has compiled (and released) other probes already.
CHILD = textwrap.dedent("""
    import json
    import bcc
    from pathlib import Path
    from probes.base import compiler_code_mappings, load_bpf, release_compiler_memory

    PROGRAM = 'TRACEPOINT_PROBE(sched, sched_process_exit) { return 0; }'

    def code_rss():
        return sum(m.rss_bytes for m in compiler_code_mappings(Path("/proc/self/smaps").read_text()))

    first = bcc.BPF(text=PROGRAM.encode())   # compiled without the release
    resident_after_compile = code_rss()
    dropped = release_compiler_memory()
    resident_after_release = code_rss()
    second = load_bpf(PROGRAM.replace("return 0", "return 1"))   # the compiler still works afterwards
    print(json.dumps({"after_compile": resident_after_compile, "dropped": dropped,
                      "after_release": resident_after_release, "after_second_load": code_rss(),
                      "second_programs": len(second.funcs)}))
""")


def test_compiler_code_is_dropped_after_a_compile_and_the_next_compile_works(require_bpf) -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    assert figures["after_compile"] > 20 * mib, figures  # LLVM's code really is resident after compiling
    assert figures["dropped"] > 20 * mib, figures
    assert figures["after_release"] < 4 * mib, figures
    # load_bpf releases again after its own compile.
    assert figures["second_programs"] == 1, figures
    assert figures["after_second_load"] < 4 * mib, figures
