# Two entry points: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install system-deps browser bench clean

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

$(STAMP): pyproject.toml setup.py native/*.c native/*.h native/*.py mmfs/mount/contract.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: system-deps $(STAMP)

demo: install
	$(PY) -m mmfs.tools.demo

test: install browser
	$(PY) -m pytest -q

bench: install
	$(PY) -m mmfs.cli bench --help

clean:
	rm -rf $(VENV) build *.egg-info mmfs/_native*.so
