"""Megatron's index cache: the files and their names, writing them safely, build locks,
and the header file that lets a re-open skip reading every file."""
