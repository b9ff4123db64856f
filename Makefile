# Two entry points: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
TESTS := $(VENV)/.installed-test

.PHONY: demo test install install-test system-deps browser bench clean report-png

# FUSE: fuse3 (fusermount3, libfuse3) and libfuse 2 beside it, so either library can serve
# (mmfs prefers libfuse 3; tests/test_libfuse.py mounts with each). Debian's and Ubuntu's
# fuse3 replaces the fuse package and links fusermount to fusermount3; libfuse 2 is
# libfuse2 on Debian 12 and libfuse2t64 on Ubuntu 24.04 (universe).
system-deps:
	@{ command -v fusermount3 >/dev/null 2>&1 && ldconfig -p | grep -q 'libfuse3.so.3 ' && \
	   ldconfig -p | grep -q 'libfuse.so.2 '; } || { \
	  apt-get update -qq; \
	  lib2=$$(apt-cache show libfuse2t64 >/dev/null 2>&1 && echo libfuse2t64 || echo libfuse2); \
	  echo "installing fuse3 (fusermount3, libfuse3-3) and $$lib2 (libfuse 2)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 $$lib2 >/dev/null; }
	@command -v getfattr >/dev/null 2>&1 || { \
	  echo "installing the Debian attr package (getfattr, used in the docs' examples)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq attr >/dev/null; }

# Headless Chromium for the tests of `mmfs report`'s page (tests/test_report_page.py).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing the Debian chromium package (headless, for the report page's tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium fonts-liberation >/dev/null; }

# Two stamps: the core (mmfs and what it imports: numpy, cffi, PyYAML, mfusepy) for the
# demo, and the test extras on top for the tests. The test stamp needs the core built
# first (order-only: a rebuilt core does not make the extras reinstall), so `make demo`
# then `make test` adds the extras, and `make test` then `make demo` changes nothing.
$(CORE): pyproject.toml setup.py native/*.c native/*.h native/*.py mmfs/mount/contract.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=77" wheel  # pyproject's build requirements (the wheel test builds without isolation)
	$(PY) -m pip install -q -e .
	touch $(CORE)

$(TESTS): pyproject.toml | $(CORE)
	$(PY) -m pip install -q -e '.[test]'
	touch $(TESTS)

install: system-deps $(CORE)

install-test: install $(TESTS)

demo: install
	$(PY) -m mmfs.tools.demo

# docs/report.png: the demo's report page, as the README shows it.
report-png: install browser
	$(PY) -m mmfs.tools.demo --screenshot docs/report.png

# Two pytest workers (pytest-xdist); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: install-test browser
	$(PY) -m pytest -q -n $(TEST_WORKERS)

bench: install
	$(PY) -m mmfs.cli bench --help

clean:
	rm -rf $(VENV) build *.egg-info mmfs/_native*.so
