"""`mmfs report`: the training mix as figures (`--json`), warnings, phases, and one
offline page."""
