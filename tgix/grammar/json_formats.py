"""JSON Schema `format` values as regexes over the string content.

Each regex follows the format's RFC and is, where the RFC and Python's checkers differ, the
stricter of the two, so a generated value passes `jsonschema`'s FormatChecker:
- date (RFC 3339 full-date, days per month and leap years exact, year 0001-9999), time
  (RFC 3339 full-time without the leap second 60, upper-case `Z`), date-time (`T`
  separator), duration (RFC 3339 appendix A);
- uuid (8-4-4-4-12 hex), ipv4 (dotted quad, no leading zeros), ipv6 (RFC 4291 text forms,
  no zone), hostname (RFC 1123 labels of 1-63 characters, at most 4 labels so the total stays
  within 253), email (dot-atom local part @ hostname-like domain);
- uri / uri-reference (RFC 3986 grammar, IPvFuture left out), json-pointer,
  relative-json-pointer;
- OpenAPI's int32 / int64 / float / double (constraints on numbers, so no constraint on a
  string), byte (base64), binary and password (any string).
Anything else raises `GrammarError`: an unknown format is not silently ignored.
"""

from __future__ import annotations

from tgix.grammar.errors import GrammarError
from tgix.grammar.json_common import CANONICAL_UNIT
from tgix.grammar.json_pattern import pattern_regex

_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    r"|02-(?:0[1-9]|1\d|2[0-8]))"
)
DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_OFFSET = r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
TIME = rf"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d+)?{_OFFSET}"
DATE_TIME = rf"{DATE}T{TIME}"
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
DURATION = rf"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
_HEX = "[0-9a-fA-F]"
UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d{2}|[1-9]?\d)"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = rf"{_HEX}{{1,4}}"
_LS32 = rf"(?:{_H16}:{_H16}|{IPV4})"


def _ipv6() -> str:
    forms = [rf"(?:{_H16}:){{6}}{_LS32}", rf"::(?:{_H16}:){{5}}{_LS32}"]
    for before, after in [(0, 4), (1, 3), (2, 2), (3, 1), (4, 0)]:
        head = rf"(?:(?:{_H16}:){{0,{before}}}{_H16})?" if before else rf"(?:{_H16})?"
        tail = rf"(?:{_H16}:){{{after}}}" if after else ""
        forms.append(rf"{head}::{tail}{_LS32}")
    forms.append(rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}")
    forms.append(rf"(?:(?:{_H16}:){{0,6}}{_H16})?::")
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_LAST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,59}[A-Za-z0-9])?"
HOSTNAME = rf"(?:{_LABEL}\.){{0,3}}{_LAST_LABEL}"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+"
_DOMAIN_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
EMAIL = rf"{_ATOM}(?:\.{_ATOM})*@{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*"

_PCT = rf"%{_HEX}{{2}}"
_UNRESERVED_SUB = r"A-Za-z0-9\-._~!$&'()*+,;="
_PCHAR = rf"(?:[{_UNRESERVED_SUB}:@]|{_PCT})"
_USERINFO = rf"(?:[{_UNRESERVED_SUB}:]|{_PCT})*"
_HOST = rf"(?:\[{IPV6}\]|(?:[{_UNRESERVED_SUB}]|{_PCT})*)"
_AUTHORITY = rf"(?:{_USERINFO}@)?{_HOST}(?::\d*)?"
_PATH_ABEMPTY = rf"(?:/{_PCHAR}*)*"
_PATH_ABSOLUTE = rf"/(?:{_PCHAR}+{_PATH_ABEMPTY})?"
_PATH_ROOTLESS = rf"{_PCHAR}+{_PATH_ABEMPTY}"
_SEGMENT_NC = rf"(?:[{_UNRESERVED_SUB}@]|{_PCT})+"
_QUERY = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*"
URI = rf"{_SCHEME}:(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_ROOTLESS})?{_QUERY}"
_RELATIVE = (
    rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NC}{_PATH_ABEMPTY})?{_QUERY}"
)
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE})"
BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"

_FORMATS = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "duration": DURATION,
    "uuid": UUID,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "hostname": HOSTNAME,
    "email": EMAIL,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "byte": BASE64,
}
# ECMA patterns for the formats whose characters may need JSON escapes.
_PATTERN_FORMATS = {
    "json-pointer": r"^(?:/(?:[^~/]|~[01])*)*$",
    "relative-json-pointer": r"^(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)$",
}
# Formats that constrain numbers only (OpenAPI) or nothing (hints for UIs).
NO_CONSTRAINT = frozenset({"int32", "int64", "float", "double", "binary", "password"})


def format_regex(name: str) -> str | None:
    """The content regex of a string format; None if the format does not constrain
    strings; GrammarError if it is unknown."""
    if name in NO_CONSTRAINT:
        return None
    if name in _FORMATS:
        return _FORMATS[name]
    if name in _PATTERN_FORMATS:
        return pattern_regex(_PATTERN_FORMATS[name], CANONICAL_UNIT)
    raise GrammarError(f"JSON Schema format {name!r} is not supported")
