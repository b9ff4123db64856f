"""The config's optional `storage:` block: how datasets in object storage are
reached and cached (mmfs.storage.settings holds what it means)."""

from __future__ import annotations

import os
import re
from fractions import Fraction
from typing import Any

from mmfs.config.safe_yaml import show
from mmfs.storage.redact import shown_url
from mmfs.storage.settings import StorageSettings, endpoint_problem

STORAGE_KEYS = {"endpoint_url", "region", "anonymous", "cache_dir", "cache_limit", "prefetch",
                "max_requests", "request_timeout", "retries"}
MIN_CACHE_LIMIT = 1 << 20  # room for the reads in flight (FUSE asks 128 KiB at most)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: Any, key: str, checker) -> int:
    """Bytes: an integer, or a string like "50GB", "512 MiB", "1.5TB"."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise checker.fail(key, f"expected a size in bytes or like \"50GB\", got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise checker.fail(key, f"{value!r} is not a size; write bytes or like \"50GB\", \"512MiB\"")
        size = int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])  # exact, and no float overflow
    return checker.integer(size, key, minimum=0, maximum=2**62)


def parse_storage(value: Any, checker, base_dir: str) -> StorageSettings:
    if value is None:
        return StorageSettings()
    if not isinstance(value, dict):
        raise checker.fail("storage", "expected a mapping (endpoint_url, region, cache_dir, ...)")
    checker.unknown_keys(value, STORAGE_KEYS, "storage.")
    out: dict[str, Any] = {}
    endpoint = value.get("endpoint_url")
    if endpoint is not None:
        if not isinstance(endpoint, str):
            raise checker.fail("storage.endpoint_url",
                               f"expected a URL like http://127.0.0.1:9000, got {show(endpoint)}")
        problem = endpoint_problem(endpoint)
        if problem is not None:
            raise checker.fail("storage.endpoint_url", f"expected a URL like http://127.0.0.1:9000: "
                                                       f"{shown_url(endpoint)!r} {problem}")
        out["endpoint_url"] = endpoint.rstrip("/")
    region = value.get("region")
    if region is not None:
        if not isinstance(region, str) or not re.fullmatch(r"[a-z0-9-]{1,64}", region):
            raise checker.fail("storage.region", f"expected a region name like us-east-1, got {region!r}")
        out["region"] = region
    if value.get("anonymous") is not None:
        out["anonymous"] = checker.boolean(value["anonymous"], "storage.anonymous")
    if value.get("cache_dir") is not None:
        folder = checker.path_text(value["cache_dir"], "storage.cache_dir", "a directory path")
        out["cache_dir"] = os.path.normpath(os.path.join(base_dir, os.path.expanduser(folder)))
    if value.get("cache_limit") is not None:
        limit = parse_size(value["cache_limit"], "storage.cache_limit", checker)
        if limit < MIN_CACHE_LIMIT:
            raise checker.fail("storage.cache_limit", f"{limit} bytes is below the least that works "
                                                      f"({MIN_CACHE_LIMIT >> 20} MiB)")
        out["cache_limit"] = limit
    if value.get("prefetch") is not None:
        out["prefetch"] = parse_size(value["prefetch"], "storage.prefetch", checker)
    if value.get("max_requests") is not None:
        out["max_requests"] = checker.integer(value["max_requests"], "storage.max_requests",
                                              minimum=1, maximum=1024)
    if value.get("request_timeout") is not None:
        timeout = checker.number(value["request_timeout"], "storage.request_timeout")
        if not 0 < timeout <= 3600:
            raise checker.fail("storage.request_timeout", f"must be between 0 and 3600 seconds, got {timeout}")
        out["request_timeout"] = timeout
    if value.get("retries") is not None:
        out["retries"] = checker.integer(value["retries"], "storage.retries", minimum=0, maximum=20)
    settings = StorageSettings(**out)
    if settings.prefetch > settings.cache_limit // 2 and "prefetch" not in out:
        raise checker.fail("storage.cache_limit", f"{settings.cache_limit} bytes is less than twice the default "
                                                  f"storage.prefetch ({settings.prefetch >> 20} MiB): give at least "
                                                  f"{2 * settings.prefetch >> 20} MiB, or set storage.prefetch to at "
                                                  "most half of it")
    if settings.prefetch > settings.cache_limit // 2:
        raise checker.fail("storage.prefetch", f"{settings.prefetch} bytes is more than half of "
                                               f"storage.cache_limit ({settings.cache_limit}): what is "
                                               "fetched ahead would push out what is read")
    return settings
