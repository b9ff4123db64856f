"""Secrets out of the messages storage libraries write: whatever boto3, botocore or
multi-storage-client says is passed through `redact` before mmfs shows or logs it
(multi-storage-client's validation message prints a whole profile, secret_key and
all; an endpoint URL may hold a user name and password)."""

from __future__ import annotations

import os
import re

MASK = "***"
# Credentials the standard AWS chain reads from the environment: masked wherever they occur.
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

# A field whose name looks like it holds a secret (secret_key, password, session_token,
# aws_access_key_id, credentials, Authorization, ...), as `name: value`, `name=value`
# or a Python/JSON mapping's `'name': 'value'`; the value is a quoted string or a word
# (a mapping or a list after the name is left: its own fields are masked one by one).
# Names start a word and are bounded: else the search backtracks quadratically in a long word.
_FIELD = re.compile(
    r"""(?P<name>(?P<q>\\*['"]?)(?<![\w-])[\w-]{0,40}(?:secret|passw|pwd|token|credential|key|auth|signature|cookie)[\w-]{0,40}(?P=q))"""
    r"""(?P<sep>\s*[:=]\s*)"""
    r"""(?P<value>(?P<e>\\+)(?P<d>['"]).*?(?P=e)(?P=d)"""  # quoted inside a repr: \'...\'
    r"""|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|(?![{\[(])[^\s,;&'"}\])\\]+)""",
    re.IGNORECASE,
)
# user:password@ (or a token@) in any URL: up to the URL's last @, since a password may
# hold @, /, ? or # (unencoded, so a URL parser cuts it elsewhere; masking too much is safe)
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]{0,40}://)[^\s'\"]*@")


def _mask_field(m: re.Match) -> str:
    value = m.group("value")
    quote = (m.group("e") or "") + (m.group("d") or (value[0] if value[0] in "'\"" else ""))
    return f"{m.group('name')}{m.group('sep')}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """`text` with every secret-looking field's value, URL credentials and the
    environment's secrets replaced by ***."""
    for name in SECRET_ENV:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _FIELD.sub(_mask_field, text)


def shown_url(url: str, limit: int = 80) -> str:
    """A URL fit for a message: credentials masked, cut to `limit` characters."""
    url = redact(url)
    return url if len(url) <= limit else url[:limit] + "..."
