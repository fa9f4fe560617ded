"""Values nested deeper than Python's decoder goes, kept as the real API server keeps them.

The real server stores objects nested up to 10,000 levels (the Go decoder's bound;
a CRD's free-form fields take anything) and rejects deeper ones. Python's decoder
gives up near 1,000 levels, so the emulator keeps such a value as its JSON text: a
body is parsed with every value nested deeper than `DEPTH` replaced by a placeholder
string naming its text, and answers put the text back in place (`dumps`). A client
therefore reads exactly what the real server would send.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from healthd.kube.decoding import prune

DEPTH = 64  # deeper values are kept as text: far below what the emulator's recursion reaches
_PREFIX = "\x00emulator: JSON text "
_ESCAPED = json.dumps(_PREFIX)[:-1]  # how the prefix reads inside encoded JSON
_PLACEHOLDER = re.compile(re.escape(_ESCAPED) + r'[0-9a-f]+"')
_TEXTS: dict[str, str] = {}  # placeholder -> the value's JSON text


def loads(text: str) -> Any:
    """The JSON value of `text`, its too-deep values kept as placeholders (the
    real server's own bound, 10,000 levels, is not enforced). ValueError when
    `text` is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        pruned, _ = prune(text, DEPTH, _keep)
        return json.loads(pruned)


def dumps(value: Any) -> str:
    """`value` as JSON text, every kept value put back in place."""
    text = json.dumps(value)
    if _ESCAPED not in text:
        return text
    return _PLACEHOLDER.sub(lambda m: _TEXTS[json.loads(m.group())], text)


def _keep(text: str) -> str:
    key = _PREFIX + hashlib.sha256(text.encode()).hexdigest()
    _TEXTS[key] = text
    return json.dumps(key)

