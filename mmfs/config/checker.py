"""Typed access to a config's raw YAML, every error naming the file and the key."""

from __future__ import annotations

import math
from typing import Any

from mmfs.config.safe_yaml import show
from mmfs.errors import ConfigError

# Linux's PATH_MAX, and more than any object URL (an S3 key is at most 1,024 bytes): a longer
# path exists nowhere, and echoing it whole made one error line of megabytes
MAX_PATH = 4096
INT64_MAX = 2**63 - 1  # Megatron holds sample counts and token ids in int64


class Checker:
    """Typed access to the raw YAML with errors naming the file and the key."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}: {message}")

    def integer(self, value: Any, key: str, minimum: int | None = None,
                maximum: int | None = INT64_MAX, why: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {show(value)}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be at most {maximum}{why}, got {show(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {show(value)}")
        return value

    def number(self, value: Any, key: str) -> float:
        """A finite float (ints convert); NaN, infinity and bools are refused."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {show(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = float("inf")
        if not math.isfinite(number):
            raise self.fail(key, f"expected a finite number, got {show(value)}")
        return number

    def unknown_keys(self, mapping: dict, allowed: set[str], where: str) -> None:
        extra = sorted((k for k in mapping if k not in allowed), key=repr)
        if extra:
            name = extra[0] if isinstance(extra[0], str) and len(extra[0]) <= 60 \
                and extra[0].isprintable() else show(extra[0])
            raise self.fail(
                f"{where}{name}", f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )

    def path_text(self, value: Any, key: str, what: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected {what}, got {show(value)}")
        if "\0" in value:
            raise self.fail(key, f"{show(value)} holds a NUL byte; give {what}")
        if len(value) > MAX_PATH or len(value.encode("utf-8", "surrogatepass")) > MAX_PATH:
            raise self.fail(key, f"{show(value)} is longer than any path ({MAX_PATH:,} bytes at most); give {what}")
        return value
