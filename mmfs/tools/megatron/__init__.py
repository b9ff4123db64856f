"""Megatron-LM's side of mmfs's tools: its launch lines read into a config (args, flags,
phase_args) and its own readers run as a baseline (baseline)."""
