#!/bin/sh
# Install mmfs and what a node needs to mount with it, on Ubuntu (22.04, 24.04) or
# Debian (12): the step a Dockerfile runs (examples/container/Dockerfile), or a node's
# setup runs once. Idempotent: packages already there are not installed again.
#
#   install.sh WHEEL       install that wheel (built once with `pip wheel . --no-deps`)
#   install.sh SOURCE_DIR  build the wheel from a checkout first (needs a C compiler)
#
# MMFS_VENV: the virtual environment mmfs goes into (default /opt/mmfs; its bin/ holds
# the `mmfs` command). MMFS_LIBFUSE=2 installs libfuse 2 instead of libfuse 3.
set -eu

src=${1:?usage: install.sh WHEEL_OR_SOURCE_DIR}
venv=${MMFS_VENV:-/opt/mmfs}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# The first of these package names this distribution knows (libfuse 2 is libfuse2t64
# on Ubuntu 24.04, libfuse2 before it and on Debian).
known() {
    for name in "$@"; do
        if apt-cache show "$name" >/dev/null 2>&1; then echo "$name"; return; fi
    done
}

# The FUSE tools (fusermount3, or fusermount) and library the mount loads, the
# Python to run mmfs, and getfattr for looking at a mount.
if [ "${MMFS_LIBFUSE:-3}" = 2 ]; then
    fuse="fuse libfuse2"
else
    fuse="fuse3 libfuse3-3"
fi
want="$fuse python3 python3-venv attr"
if [ -d "$src" ]; then
    want="$want gcc python3-dev"  # the C core is compiled into the wheel
fi
missing=""
for package in $want; do
    installed "$package" || missing="$missing $package"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "install.sh: these packages are missing:$missing; install them as root (apt-get install$missing)" >&2
        exit 2
    fi
    apt-get update -qq
    resolved=""
    for package in $missing; do
        case $package in
            libfuse2) package=$(known libfuse2t64 libfuse2) ;;
            libfuse3-3) package=$(known libfuse3-4 libfuse3-3) ;;
        esac
        resolved="$resolved $package"
    done
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $resolved >/dev/null
fi

# mmfs into its own virtual environment: numpy, cffi, PyYAML and the FUSE binding come
# with it from the package index.
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if [ -d "$src" ]; then
    dist=$(mktemp -d)
    "$venv/bin/python" -m pip wheel -q --no-deps -w "$dist" "$src"
    set -- "$dist"/mmfs-*.whl
    wheel=$1
else
    wheel=$src
fi
"$venv/bin/python" -m pip install -q "$wheel"
"$venv/bin/mmfs" --help >/dev/null
echo "install.sh: mmfs installed in $venv (the command: $venv/bin/mmfs)"
