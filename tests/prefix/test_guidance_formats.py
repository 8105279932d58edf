"""The block-filling guidance agrees with the verdict format it is appended to: the compact guidance asks for
compact lines and never for JSON or a written confidence (the confidence comes from the engine's logprobs)."""

from __future__ import annotations

import re

from gateway.http.auth import KeyRing
from gateway.http.services import open_services
from gateway.settings import Settings
from shaping.prefix import GUIDANCE_VERSIONS, guidance_pieces, guidance_version_for, load_guidance
from shaping.prompt import PROMPT_VERSIONS, load_system_prompt, prompt_version_for
from shaping.verdict import VERDICT_FORMATS, compact_regex, parse_compact_verdict
from tests.support import SimFactory

# What asks the model for the JSON object or for a number of its own: the object's braces and field names,
# the word, and "confidence" in either language (置信 "confidence", 把握 "certainty", as v1 words it).
JSON_OR_CONFIDENCE = re.compile(r'json|[{}]|"verdict"|categories|confidence|置信|把握', re.IGNORECASE)
# A compact verdict as the guidance writes one in its examples and rules.
COMPACT_VERDICT = re.compile(r"(?<![A-Za-z])(?:allow|review|block:[a-z/,-]+)(?![A-Za-z])")


def text_of(version: str) -> str:
    return "\n".join(load_guidance(version))


def test_each_format_has_its_own_guidance_and_the_compact_one_is_v2() -> None:
    assert set(GUIDANCE_VERSIONS) == set(VERDICT_FORMATS) == set(PROMPT_VERSIONS)
    assert guidance_version_for("compact") == "v2"
    assert guidance_version_for("json") == "v1"


def test_the_compact_guidance_never_asks_for_json_or_a_written_confidence() -> None:
    assert JSON_OR_CONFIDENCE.findall(text_of(guidance_version_for("compact"))) == []
    # The check would see it: the JSON guidance asks for both.
    found = {match.lower() for match in JSON_OR_CONFIDENCE.findall(text_of(guidance_version_for("json")))}
    assert {"json", "{", "confidence", "把握"} <= found


def test_every_verdict_the_compact_guidance_writes_is_one_the_grammar_allows() -> None:
    verdicts = COMPACT_VERDICT.findall(text_of(guidance_version_for("compact")))
    assert {"allow", "review"} <= set(verdicts)
    blocks = [verdict for verdict in verdicts if verdict.startswith("block:")]
    assert len(blocks) >= 20  # the worked examples
    for verdict in blocks:
        assert re.fullmatch(compact_regex(), verdict), verdict
        assert parse_compact_verdict(verdict).problem is None, verdict


def test_the_fill_never_cuts_a_compact_verdict() -> None:
    lines = load_guidance(guidance_version_for("compact"))
    pieces = [piece for _, piece in guidance_pieces(lines)]
    blocks = [verdict for line in lines for verdict in COMPACT_VERDICT.findall(line) if ":" in verdict]
    assert blocks
    for verdict in blocks:  # whole inside one piece, so a fill that ends after any piece holds it whole
        assert any(verdict in piece for piece in pieces), verdict


def test_an_ascii_mark_before_a_letter_is_no_clause_end_and_one_before_anything_else_is() -> None:
    pieces = [piece for _, piece in guidance_pieces(["输出 block:violence,hate。再看, 然后:下一句;0.5"])]
    assert pieces == ["输出 block:violence,hate。", "再看,", " 然后:", "下一句;", "0.", "5"]


async def test_the_gateway_fills_each_formats_prompt_with_the_guidance_that_agrees_with_it(
    start_sim: SimFactory,
) -> None:
    sim = start_sim("spark")
    settings = Settings(
        engine={"url": sim.url}, shaping={"block_filling_prefix": True},
        telemetry={"engine_scrape_interval_s": 0},
    )
    async with open_services(settings, KeyRing({}, None)) as services:
        sent = services.moderation.system_prompts
    for each in VERDICT_FORMATS:
        base = load_system_prompt(prompt_version_for(each)).text
        assert sent[each].text.startswith(base + "\n"), each
        added = sent[each].text.removeprefix(base + "\n")
        assert len(added) > 1000  # the Spark's block is far past the plain prompt
        assert text_of(guidance_version_for(each)).startswith(added), each
    compact_added = sent["compact"].text.removeprefix(load_system_prompt(prompt_version_for("compact")).text)
    assert JSON_OR_CONFIDENCE.findall(compact_added) == []
