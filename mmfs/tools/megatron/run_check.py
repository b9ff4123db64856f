"""`mmfs config --from-megatron` looks at the run the config describes: where it reads
more of a dataset than one epoch holds (mmfs/megatron/epochs.py), said with the
iteration as `mmfs build` and `mmfs mount` say it.

The config is loaded from its text as saved in the folder Megatron is launched from
(the current one: its relative paths are read from there). Nothing is built: the
splits as the builder plans them, the datasets' .idx lengths and each blend's order
computed up to the draw looked for. Where the data cannot be opened here (not
reachable yet, object storage not configured), nothing is said: `mmfs build` and
`mmfs mount` say it.
"""

from __future__ import annotations

import logging
import os
import tempfile

from mmfs.errors import MmfsError

log = logging.getLogger(__name__)


def run_warnings(text: str) -> list[str]:
    """The epoch warnings of the config `text` (as `mmfs build` would say them), on stderr."""
    from mmfs.config.schema import load_config
    from mmfs.formats import open_dataset
    from mmfs.megatron.epochs import planned_warnings, say

    try:
        with tempfile.NamedTemporaryFile("w", dir=os.getcwd(), prefix=".mmfs-config-", suffix=".yaml") as f:
            f.write(text)
            f.flush()
            config = load_config(f.name)
        datasets = {spec.file: open_dataset(spec.file) for spec in config.all_datasets}
        return say(planned_warnings(config, datasets))
    except (MmfsError, OSError) as exc:
        log.debug("the run's epochs were not looked at: %s", exc)
        return []
