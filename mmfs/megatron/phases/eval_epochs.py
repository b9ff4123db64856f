"""Where the relaunches of a restart run read more of a dataset than its documents
hold in their own valid and test: per phase and split, the dataset, the run's
evaluation step and what Megatron-LM does there (said beside the train lines,
mmfs/megatron/phases/epochs.py; mmfs/megatron/epochs.py says why by tokens).

Launch k reads the run's valid stream from its loader's consumed_valid_samples
to its last evaluation's end, from phase k's own valid (evals.py builds it,
evaluations.py says which launch reads which part); only the last launch reads
test, from its sample 0. So phase k's valid is looked at in the positions its
launch reads: a dataset drawn there past its documents (its GPTDataset's samples
counted from the phase valid's sample 0, earlier launches' positions included)
has its line. Under continue there is one launch: the top level's lines say it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mmfs.megatron.epoch_lines import EXACT_UP_TO, Member, reads_past, where
from mmfs.megatron.phases.epochs import RESTART_SAYS
from mmfs.megatron.phases.evals import EVAL_SPLITS
from mmfs.megatron.phases.evaluations import eval_schedule, test_launches, valid_launches

# one split of a phase: its GPTDatasets' Members, the blend's normalized weights and
# its first n dataset ids (None, None: the split is one GPTDataset)
EvalSplit = tuple[list[Member], "list[float] | None", "Callable[[int], np.ndarray] | None"]


def phase_eval_warnings(config: Any, splits_of: Callable[[int], dict[str, EvalSplit]],
                        cyclic: bool) -> list[str] | None:
    """The valid and test lines of each phase of a restart run (splits_of(k): phase
    k's own valid and test); None when there are none to look at this way (continue,
    or a training block that does not say when Megatron evaluates)."""
    phases, training = config.phases, config.training
    if phases is None or phases.mode != "restart":
        return None
    schedule = eval_schedule(training, phases.train_samples)
    starts = [p.start_iteration for p in phases.phases]
    if schedule is None or None in starts:
        return None
    launches = {"valid": valid_launches(schedule, starts), "test": test_launches(schedule, len(starts))}
    out = []
    for k in range(len(starts)):
        own: dict[str, EvalSplit] | None = None
        for split in EVAL_SPLITS:
            launch = launches[split][k]
            if launch.count == 0:
                continue
            own = splits_of(k) if own is None else own
            if split not in own:
                continue
            start, end = launch.loader_start, launch.read_end
            for p in reads_past(start, end, *own[split]):
                m = p.member
                near = "about " if p.about or end > EXACT_UP_TO and p.reach != end else ""
                at = where(split, p.first, training.split_schedule(split), cyclic, p.about)
                out.append(f"{split}: phases[{k}]: {m.name} is read past its documents {at}: the launch of "
                           f"phases[{k}] reads the run's {split} samples {start:,} to {end - 1:,} from the phase's "
                           f"own {split}, which by then has drawn {near}{p.reach:,} of the dataset's samples "
                           f"({near}{p.read:,} in the launch); its documents hold {m.one_epoch:,} "
                           f"({m.epochs(p.reach):.2f} epochs). {RESTART_SAYS}")
    return out
