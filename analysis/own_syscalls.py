"""Syscalls that infersight's own probes make a target do, so every view can say they are ours."""

# 335 on x86-64 (Linux 6.11+): a uretprobe's return trampoline; the GC probe's uretprobe on gc_collect_main.
OWN_SYSCALLS: dict[str, str] = {"uretprobe": "infersight's GC probe"}
