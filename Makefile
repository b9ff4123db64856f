# Two entry points: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
TESTS := $(VENV)/.installed-test

.PHONY: demo test install install-test system-deps browser bench clean report-png

system-deps:
	@command -v fusermount >/dev/null 2>&1 || { \
	  echo "installing the Debian fuse package (fusermount, libfuse2)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse libfuse2 >/dev/null; }
	@ldconfig -p | grep -q 'libfuse.so.2' || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse2 >/dev/null; }
	@command -v getfattr >/dev/null 2>&1 || { \
	  echo "installing the Debian attr package (getfattr, used in the docs' examples)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq attr >/dev/null; }

# Headless Chromium for the tests of `mmfs report`'s page (tests/test_report_page.py).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing the Debian chromium package (headless, for the report page's tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium fonts-liberation >/dev/null; }

# Two stamps: the core (mmfs and what it imports: numpy, cffi, PyYAML, fusepy) for the
# demo, and the test extras on top for the tests. The test stamp needs the core built
# first (order-only: a rebuilt core does not make the extras reinstall), so `make demo`
# then `make test` adds the extras, and `make test` then `make demo` changes nothing.
$(CORE): pyproject.toml setup.py native/*.c native/*.h native/*.py mmfs/mount/contract.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
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
