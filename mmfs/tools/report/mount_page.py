"""MOUNT/report.html's bytes: `mmfs report`'s page of the mounted config or, when it
cannot be made (a dataset gone since the mount, say), a short page that says why and
what to do. The mount runs this module in a child process (mmfs/mount/report_file.py),
so that the figures and their memory never load into the daemon:

    python -m mmfs.tools.report.mount_page SNAPSHOT OUT.html

SNAPSHOT is the mount's Config, pickled by the mount itself (a file of its own private
folder): the page is of the config as it was mounted, whatever the file says now.
OUT.html is written either way; exit 0 for the page, 2 for a page saying why not (the
reason on stderr, one `mmfs: error: ...` line)."""

from __future__ import annotations

import html
import logging
import os
import pickle
import sys
from typing import Any

from mmfs.errors import MmfsError

ERROR_PREFIX = "mmfs: error: "


def mount_page(config: Any) -> tuple[bytes, str | None]:
    """(the page of the config, a loaded Config or a path, None), or (a page saying why there
    is none, why)."""
    from mmfs.megatron import open_corpus
    from mmfs.tools.report.command import figures
    from mmfs.tools.report.page import page_bytes

    try:
        return page_bytes(figures(open_corpus(config, progress=False))), None
    except MmfsError as exc:
        return not_made_page(str(exc)).encode("utf-8"), str(exc)


def not_made_page(why: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>mmfs report</title></head><body>"
            f"<h1>mmfs report</h1><p>This mount's report could not be made: {html.escape(why)}</p>"
            "<p>Once that is fixed, mount again, or run <code>mmfs report CONFIG -o report.html</code>.</p>"
            "</body></html>\n")


def main(argv: list[str]) -> int:
    snapshot, out = argv
    logging.basicConfig(level=logging.ERROR, format="mmfs: %(message)s", stream=sys.stderr)
    with open(snapshot, "rb") as f:
        config = pickle.load(f)  # the parent mount's own, in a folder only this user can write
    data, why = mount_page(config)
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    if why is None:
        return 0
    print(ERROR_PREFIX + " ".join(why.splitlines()), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
