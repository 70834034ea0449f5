"""Example UDFs shipped with Lakeshore (the demo runs them; daemons import them by path)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

from lakeshore.sdk import udf


@udf(queue="demo")
def render_tile(tile: int, seconds: float = 0.2) -> dict[str, object]:
    """Pretend to render one tile of an image: a little work, a little waiting."""
    started = time.perf_counter()
    digest = hashlib.sha256(str(tile).encode())
    for _ in range(2000):
        digest = hashlib.sha256(digest.digest())
    time.sleep(max(0.0, seconds - (time.perf_counter() - started)))
    return {"tile": tile, "checksum": digest.hexdigest()[:12]}


@udf(queue="demo")
def count_words(text: str) -> Iterator[dict[str, object]]:
    """Stream a running word count, one item per word (a generator UDF)."""
    seen: dict[str, int] = {}
    for word in text.split():
        seen[word] = seen.get(word, 0) + 1
        yield {"word": word, "count": seen[word]}
