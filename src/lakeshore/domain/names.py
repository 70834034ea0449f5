"""Names users choose: queues, namespaces, providers, pools.

One rule for all of them keeps URLs, CLI arguments and YAML keys unambiguous:
1-63 characters of lowercase letters, digits, ``-``, ``_`` and ``.``, starting with a
letter or a digit.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, StrictStr

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
NAME_RULE = (
    "1-63 characters of lowercase letters, digits, '-', '_' and '.', "
    "starting with a letter or a digit"
)


def is_valid_name(value: str) -> bool:
    return NAME_RE.fullmatch(value) is not None


def check_name(value: str) -> str:
    if not is_valid_name(value):
        raise ValueError(f"{value!r} is not a valid name: use {NAME_RULE}")
    return value


Name = Annotated[
    StrictStr,
    AfterValidator(check_name),
    # published in the JSON Schema; the validator above gives the friendlier message
    Field(json_schema_extra={"pattern": f"^{NAME_RE.pattern}$", "minLength": 1, "maxLength": 63}),
]
