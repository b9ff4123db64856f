"""Reading a YAML config a hostile user wrote: bounded in size, depth and alias
expansion, and giving back only plain values (mappings, lists, strings, numbers,
booleans, null). Every refusal is a ConfigError of one line naming the file and
the line or the key; nothing here can raise anything else.
"""

from __future__ import annotations

import hashlib
import re
import reprlib
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from mmfs.errors import ConfigError
from mmfs.storage.file import file_problem

MAX_CONFIG_BYTES = 2 << 20  # a blend of 32,766 datasets (Megatron's most) fits
MAX_DEPTH = 64  # a config nests four or five levels
MAX_ALIAS_EXPANSION = 100_000  # values aliases may add beyond those written out
MAX_INT_DIGITS = 4300  # Python's own limit for int <-> str conversion

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxdict = 4
_short.maxlevel = 2


def show(value: Any) -> str:
    """A short one-line repr for error messages (never fails on a huge int)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        return _short.repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails must not hide the real error
        return f"a {type(value).__name__}"


def key_path(parent: str, key: Any) -> str:
    """`parent.key`, with a key that is not a plain word shown as its repr."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_.+-]{1,60}", key):
        text = key
    else:
        text = show(key)
    return f"{parent}.{text}" if parent else text


class _Refused:
    """A YAML value mmfs never accepts (a date, a set, binary, ordered pairs, an
    integer too long to print); the key it sits under is named when found."""

    def __init__(self, what: str, text: str | None, advice: str) -> None:
        self.what = what
        self.text = text
        self.advice = advice

    def __str__(self) -> str:
        shown = "" if self.text is None else f" ({show(self.text)})"
        return f"{self.what}{shown} is not accepted here; {self.advice}"


class _LimitError(yaml.composer.ComposerError):
    """Valid YAML that mmfs refuses (too deep, an alias bomb, a cycle)."""


try:
    from yaml.cyaml import CParser

    class _SafeLoader(Composer, CParser, SafeConstructor, Resolver):
        """SafeLoader's Python composer (whose depth and aliases are checked below)
        over libyaml's parser, which parses four times faster than PyYAML's own."""

        def __init__(self, stream) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
except ImportError:  # PyYAML built without libyaml
    _SafeLoader = yaml.SafeLoader


class ConfigLoader(_SafeLoader):
    """SafeLoader with limits: nesting depth, alias expansion, integer length;
    dates, sets, binary and ordered pairs load as _Refused markers; a scalar that
    does not convert under an explicit tag (`!!int abc`) is a YAML error."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and self._aliases:
            written, expanded = _node_counts(node)
            if expanded is None:
                raise _LimitError(None, None, "an alias refers to a value that contains it "
                                  "(a cycle)", node.start_mark)
            if expanded > written + MAX_ALIAS_EXPANSION:
                raise _LimitError(
                    None, None, f"aliases expand to {expanded:,} values (at most "
                    f"{MAX_ALIAS_EXPANSION:,} more than written); write the values out",
                    node.start_mark)
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, IndexError, TypeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {show(getattr(node, 'value', ''))} as {node.tag} "
                f"({type(exc).__name__})", node.start_mark) from None

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node)
        too_long = _Refused(f"an integer of {len(text)} characters", text[:20] + "...",
                            "no key takes a number this large")
        if isinstance(text, str) and len(text) > MAX_INT_DIGITS:
            return too_long
        value = super().construct_yaml_int(node)
        # hex and octal digits make longer decimals, which str() and json refuse
        return too_long if value.bit_length() > MAX_INT_DIGITS * 3 else value

    def _refuse(what, advice):  # a constructor factory, used in the class body only
        def construct(self, node):
            return _Refused(what, node.value if isinstance(node.value, str) else None, advice)
        return construct

    construct_timestamp = _refuse("a YAML date or time", "quote it to make it a string")
    construct_set = _refuse("a YAML set (!!set)", "write a list or a mapping")
    construct_binary = _refuse("binary data (!!binary)", "write a string")
    construct_pairs = _refuse("ordered pairs (!!omap or !!pairs)", "write a mapping")
    del _refuse


ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)
ConfigLoader.add_constructor("tag:yaml.org,2002:timestamp", ConfigLoader.construct_timestamp)
ConfigLoader.add_constructor("tag:yaml.org,2002:set", ConfigLoader.construct_set)
ConfigLoader.add_constructor("tag:yaml.org,2002:binary", ConfigLoader.construct_binary)
ConfigLoader.add_constructor("tag:yaml.org,2002:omap", ConfigLoader.construct_pairs)
ConfigLoader.add_constructor("tag:yaml.org,2002:pairs", ConfigLoader.construct_pairs)


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _node_counts(root) -> tuple[int, int | None]:
    """(distinct nodes, nodes once every alias is expanded, or None for a cycle);
    iterative and memoised, so neither depth nor an alias bomb costs more than
    the nodes written."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            continue
        if key in sizes:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                return len(sizes), None
            if id(child) not in sizes:
                stack.append((child, False))
    return len(sizes), sizes[id(root)]


class _Position(int):
    """A list position in a key path (shown as [i], where a mapping key is .k)."""


def _key_text(keys: tuple) -> str:
    text = ""
    for k in keys:
        text = f"{text}[{k}]" if isinstance(k, _Position) else key_path(text, k)
    return text or "the config"


def check_plain(value: Any, path: str) -> None:
    """Raise naming the key of the first value that is not plain YAML data."""
    stack: list[tuple[tuple, Any]] = [((), value)]
    scalars = (str, int, float, bool, type(None))
    while stack:
        keys, v = stack.pop()
        if isinstance(v, dict):
            for k, child in v.items():
                if not isinstance(k, scalars):
                    what = k.what if isinstance(k, _Refused) else f"a {type(k).__name__}"
                    raise ConfigError(f"{path}: {_key_text(keys)}: a key is {what}; keys must "
                                      "be plain words")
                if not isinstance(child, scalars):
                    stack.append(((*keys, k), child))
        elif isinstance(v, list):
            stack.extend(((*keys, _Position(i)), child) for i, child in enumerate(v)
                         if not isinstance(child, scalars))
        elif isinstance(v, _Refused):
            raise ConfigError(f"{path}: {_key_text(keys)}: {v}")
        elif not isinstance(v, scalars):
            raise ConfigError(f"{path}: {_key_text(keys)}: a {type(v).__name__} is not "
                              "accepted here")


def _tab_near(text: str, mark) -> tuple[int, int] | None:
    """(line, column), 1-based, of the tab at an error's mark or before it on its line
    (where the scanner stopped at the indentation or the token a tab broke), or None."""
    if mark is None:
        return None
    lines = text.splitlines()
    if not 0 <= mark.line < len(lines):
        return None
    line = lines[mark.line]
    col = line.find("\t", 0, mark.column + 1)
    return None if col < 0 else (mark.line + 1, col + 1)


def read_yaml(path: str) -> Any:
    """The config file's YAML document, size- and type-checked (plain data only)."""
    return read_yaml_source(path)[0]


def read_yaml_source(path: str) -> tuple[Any, str]:
    """read_yaml's document and the sha256 of the bytes it was parsed from."""
    problem = file_problem(path)
    if problem is not None:
        raise ConfigError(f"{path}: {problem}; give a YAML config file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; "
                          "a config is a few keys: is this the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") \
            from None
    loader = None
    try:
        loader = ConfigLoader(text)  # checks the characters already
        raw = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        what = "refused" if isinstance(exc, _LimitError) else "not valid YAML"
        if "maximum nesting depth" in problem:  # libyaml's own limit can fire before ours
            what, problem = "refused", f"nested deeper than {MAX_DEPTH} levels"
        elif (tab := _tab_near(text, mark)) is not None:  # PyYAML names a tab by what it cannot start
            where = f" at line {tab[0]}, column {tab[1]}"
            problem = "a tab character; YAML indents and separates with spaces only: replace the tab with spaces"
        raise ConfigError(f"{path}: {what}{where}: {problem}".replace("\n", " ")) from None
    except RecursionError:  # depth is limited above; this is a last line of defence
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    check_plain(raw, path)
    return raw, hashlib.sha256(data).hexdigest()


__all__ = ["read_yaml", "read_yaml_source", "check_plain", "show", "key_path", "ConfigLoader", "MAX_CONFIG_BYTES"]
