# infersight — one command to set up a host, one to run the demo, one to run the tests.
#
# `make setup` is idempotent: a second run on a set-up machine checks stamps and exits in seconds.
# It must run as root on Debian 12: it installs Debian packages, links kernel headers,
# mounts tracefs and builds the virtual env in .venv.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
STAMPS := .setup-stamps
KERNEL := $(shell uname -r)
MODDIR := /lib/modules/$(KERNEL)
PYTEST_ARGS ?=

# Debian packages every feature needs: BCC and its tools (also the benchmark baseline),
# headers for BCC's compiler, nftables/iproute2 for real packet loss in network namespaces,
# a C compiler for the micro-workloads, bpftool for the tcpretrans gap diagnostic's BTF offsets,
# systemd-analyze and libseccomp's Python binding to score and apply the systemd unit in tests.
DEB_PACKAGES := python3-bpfcc bpfcc-tools libbpfcc nftables iproute2 gcc libc6-dev procps \
	prometheus prometheus-alertmanager chromium chromium-driver golang-go bpftool systemd python3-seccomp

.PHONY: setup debs headers tracefs venv bcc-link test check demo doctor lint clean help

help:
	@echo "make setup   install everything (root, Debian 12); idempotent"
	@echo "make demo    workload + load + agent with its status page"
	@echo "make test    setup, then the whole pytest suite (what CI runs, ~20 min)"
	@echo "make check   lint + the tests that need no BPF, browser, network namespace, live server or replay (< 3 min)"
	@echo "make doctor  check this host's requirements"

setup: debs headers tracefs venv bcc-link
	@echo "setup: done ($(VENV) ready; run 'make doctor' to check the host)"

debs:
	@if [ "$$(id -u)" != 0 ]; then echo "setup: must run as root (it installs Debian packages)" >&2; exit 1; fi
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "setup: installing Debian packages:$$missing"; \
		apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Headers for the running kernel when Debian has them; otherwise the distribution's
# nearest tree, linked with a warning. Safe for us: probes use tracepoints and uprobes
# only and never dereference kernel structs (docs/kernel.md, "Rules every probe keeps").
headers: debs
	@if [ -e $(MODDIR)/build/include ]; then exit 0; fi; \
	if apt-cache show linux-headers-$(KERNEL) >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-headers-$(KERNEL); exit 0; \
	fi; \
	dpkg-query -W -f='$${Status}' linux-headers-amd64 2>/dev/null | grep -q "install ok installed" || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-headers-amd64; \
	build=$$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n 1); \
	source=$${build%-amd64}-common; \
	mkdir -p $(MODDIR); \
	ln -sfn $$build $(MODDIR)/build; \
	ln -sfn $$source $(MODDIR)/source; \
	echo "WARNING: no kernel headers for $(KERNEL); linked $$build as $(MODDIR)/build." \
	     "infersight's probes use only tracepoints and uprobes, so mismatched headers are safe." >&2

tracefs:
	@mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
	@mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug

$(STAMPS):
	mkdir -p $(STAMPS)

venv: $(STAMPS)/venv

# pip runs again only when the package metadata changes.
$(STAMPS)/venv: setup.cfg pyproject.toml | $(STAMPS)
	@[ -x $(VENV)/bin/python ] || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch is pinned exactly: the CPU wheel is on local disk; a looser pin pulls CUDA wheels.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

# BCC's Python module is pure Python over libbcc.so: expose only that package to the venv.
bcc-link: venv
	@site=$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	[ -L $$site/bcc ] || ln -sfn /usr/lib/python3/dist-packages/bcc $$site/bcc

# pytest exits 5 when it collected nothing: a suite that runs no test is broken, never a pass.
test: setup
	@$(VENV)/bin/python -m pytest $(PYTEST_ARGS) || { rc=$$?; \
		[ $$rc -ne 5 ] || echo "make test: pytest collected no tests: failing" >&2; exit $$rc; }

# The developer's loop: lint, then every test that needs no BPF program, browser, network namespace, live
# workload or replay of the recorded suites, and takes no more than a few seconds. `make test` runs them all.
CHECK_MARKERS := not (bpf or root or slow or workload or netns or browser or replay)
check: setup
	$(VENV)/bin/ruff check .
	@$(VENV)/bin/python -m pytest -q -m "$(CHECK_MARKERS)" $(PYTEST_ARGS) || { rc=$$?; \
		[ $$rc -ne 5 ] || echo "make check: pytest collected no tests: failing" >&2; exit $$rc; }

doctor: setup
	$(VENV)/bin/infersight doctor

demo: setup
	$(VENV)/bin/python -m agent.demo

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(STAMPS) *.egg-info
