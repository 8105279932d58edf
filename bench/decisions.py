"""Prompt tokens the engine computed for one ``POST /v1/decisions`` of 1, 10 and 50 predicate questions about
one keyframe: the request's usage, ``input_tokens - cached_tokens`` (the prompt minus what the engine's
prefix cache held), beside ``input_tokens`` (what N separate requests would have computed with no cache).

The gateway runs in this process on the built-in simulator (instant preset), or in front of ``--engine URL``
(the real vLLM CPU engine). Each count is asked once after the engine's cache was warmed by nothing: the
first question computes the input, the others take it from the cache.

    python -m bench.decisions [--engine http://127.0.0.1:8000] [--caption-words 0] [--json FILE]

An engine caches whole blocks (vLLM's CPU build: 128 tokens): a shared input shorter than one block is
computed again by every question, which ``--caption-words`` shows against a longer one.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from typing import Any

import httpx

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from deploy.simulator import PRESETS, create_sim_app
from gateway.http.app import create_app
from gateway.settings import EngineSettings, Settings

COUNTS = (1, 10, 50)


def measure(gateway_url: str, count: int, seed: int, caption_words: int = 0) -> dict[str, Any]:
    """One request of ``count`` questions about a fresh keyframe (and a caption of ``caption_words``
    words, a longer shared input): its usage."""
    frame = base64.b64encode(make_keyframe("allow", 1280, 720, seed=seed)).decode()
    questions = [
        {"type": "predicate", "instructions": f"Statement {i}: the frame shows object number {i}."}
        for i in range(count)
    ]
    body = {
        "model": "m",
        "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": f"data:image/jpeg;base64,{frame}"},
            *([{"type": "input_text", "text": caption(caption_words, seed)}] if caption_words else []),
        ]}],
        "questions": questions,
    }
    response = httpx.post(f"{gateway_url}/v1/decisions", json=body, timeout=1800)
    response.raise_for_status()
    usage = response.json()["usage"]
    prompt, cached = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    return {"questions": count, "prompt_tokens": prompt, "cached_tokens": cached, "computed": prompt - cached}


def caption(words: int, seed: int) -> str:
    """A caption of ``words`` words, its own per request (nothing of it cached by an earlier one)."""
    vocabulary = ("street", "crowd", "banner", "evening", "market", "river", "bridge", "stage", "music")
    return f"Upload {seed}: " + " ".join(vocabulary[(seed + i * 7) % len(vocabulary)] for i in range(words))


def main(argv: list[str] | None = None) -> None:
    """Print the table; ``--json`` writes it with the command, date and machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", help="a running engine's URL (default: the built-in simulator)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--caption-words", type=int, default=0,
                        help="a caption of this many words beside the image (a shared input longer than "
                             "the engine's cache block)")
    args = parser.parse_args(argv)
    servers: list[ThreadedServer] = []
    try:
        if args.engine is None:
            sim = ThreadedServer(create_sim_app(PRESETS["instant"], 0.0)).start()
            servers.append(sim)
            engine, label = sim.url, "simulator (instant preset)"
        else:
            engine, label = args.engine, f"engine at {args.engine}"
        gateway = ThreadedServer(create_app(Settings(engine=EngineSettings(url=engine)))).start()
        servers.append(gateway)
        rows = [measure(gateway.url, count, 100 + count, args.caption_words) for count in COUNTS]
    finally:
        for server in reversed(servers):
            server.stop()
    print(label)
    print("| questions | prompt tokens | cached | computed by the engine |\n| --- | --- | --- | --- |")
    for row in rows:
        cells = (row["questions"], row["prompt_tokens"], row["cached_tokens"], row["computed"])
        print("| " + " | ".join(f"{cell:,}" for cell in cells) + " |")
    if args.json:
        record = {
            "command": "python -m bench.decisions " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} cores",
            "engine": label,
            "caption_words": args.caption_words,
            "rows": rows,
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
