"""One JSON object per log line, the same shape for both programs: the control plane's
``SUPERAGENT_LOG_FORMAT=json`` and `endpointd run --json`.

A line holds the time (UTC, ISO 8601, milliseconds), level, logger, message, and the
exception or stack when there is one: nothing that could carry a secret which the message
itself did not. The exception text is the record's own ``exc_text`` when a filter already
set it (endpointd's redacting filter masks credential values in it), as logging's own
formatter does.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and :meth:`fields`)."""

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        """More keys for a line; none here (the control plane adds its trace id)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(self.fields(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)
