"""A run in phases (config `phases:`, docs/phases.md): the run's blend across phase
boundaries, its build, the facts per phase, and a resume with a phase added or changed."""
