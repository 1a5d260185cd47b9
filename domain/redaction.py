"""Keeping secrets out of logs, events and problem bodies.

What could leak, and where it is stopped:
- bound parameters of a failed SQL statement (a webhook secret being inserted): engines are created with
  `hide_parameters=True` (domain/db.py), so exception messages carry none;
- an `api_key=`/`token=`/`signature=`... query parameter in the access log, or credentials in a URL
  (`redis://:password@host`): `redact_url` / `redact_text` replace them with `[redacted]`;
- anything shaped like one of our secrets (`dsk_...` API keys, `whsec_...` signing secrets, the token of a
  `/dashboard/downloads/<token>` link) or an `Authorization` value, wherever it turns up in a log message: `install_log_redaction` rewrites every
  record of the process as it is created (the API installs it in `create_app`; the worker can too).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[redacted]"
_SECRET_QUERY_KEY_RE = re.compile(
    r"(?i)(key|token|secret|password|passwd|pwd|signature|sig|auth|credential|session|code)"
)
# Our own secret formats, bearer values, and URL userinfo passwords.
_SECRET_TEXT_RES = (
    re.compile(r"\bdsk_[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bwhsec_[A-Za-z0-9+/=]{8,}"),
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"(?i)(?<=://)[^/\s:@]*:[^/\s@]+(?=@)"),  # scheme://user:password@host
    # A dashboard download link is a bearer credential for its artifact until it expires (the access log
    # writes request paths, so the log must not keep it).
    re.compile(r"(?<=/dashboard/downloads/)[^\s/?#\"']+"),
)
_QUERY_PAIR_RE = re.compile(r"(?P<key>[^?&=\s\"']+)=(?P<value>[^&\s\"']*)")


_known_values: set[str] = set()


def secret_setting_values(settings: Any) -> list[str]:
    """Every SecretStr setting's value (storage and Hub credentials, peppers): kept out of logs verbatim."""
    from pydantic import SecretStr

    values = [getattr(settings, name) for name in type(settings).model_fields]
    return [value.get_secret_value() for value in values if isinstance(value, SecretStr)]


def register_secret_values(*values: str | None) -> None:
    """Deployment secrets known by value (storage and Hub credentials, the key pepper): redacted verbatim
    wherever they turn up, whatever their shape."""
    _known_values.update(value for value in values if value and len(value) >= 8)


def is_secret_query_key(key: str) -> bool:
    return bool(_SECRET_QUERY_KEY_RE.search(key))


def redact_url(url: str) -> str:
    """`url` with key-looking query values and userinfo passwords replaced."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    query = urlencode([(k, REDACTED if is_secret_query_key(k) else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="[]")
    netloc = parts.netloc
    if parts.password:
        netloc = netloc.replace(f":{parts.password}@", f":{REDACTED}@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Free text with our secret formats, bearer values, URL passwords, key-looking query values and
    registered secret values replaced."""
    for value in _known_values:
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern in _SECRET_TEXT_RES:
        text = pattern.sub(lambda m: m.group(1) + " " + REDACTED if m.re.groups else REDACTED, text)
    if "=" in text:
        text = _QUERY_PAIR_RE.sub(
            lambda m: f"{m.group('key')}={REDACTED}" if is_secret_query_key(m.group("key")) else m.group(0), text)
    return text


_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _redact_arg(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    # Objects too (httpx logs an httpx.URL): replaced by their redacted text only when that differs.
    text = value if isinstance(value, str) else str(value)
    redacted = redact_text(text)
    # A request path with a line break must not forge a second log line: control characters are escaped.
    redacted = _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", redacted)
    return redacted if redacted != text or isinstance(value, str) else value


def redact_record(record: logging.LogRecord) -> None:
    """Rewrite a record's message, arguments and traceback text in place."""
    if isinstance(record.msg, str):
        record.msg = redact_text(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_redact_arg(arg) for arg in record.args)
    elif isinstance(record.args, dict):
        record.args = {key: _redact_arg(value) for key, value in record.args.items()}
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        # Render the traceback now, redacted; formatters reuse exc_text instead of rendering it again.
        record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))


def install_log_redaction() -> None:
    """Redact every log record of this process when it is created, whichever logger it comes from
    (uvicorn's access log passes the request path, query string included, as an argument). A record
    factory rather than a filter: logger filters do not see records of child loggers. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "draftsmith_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    factory.draftsmith_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
