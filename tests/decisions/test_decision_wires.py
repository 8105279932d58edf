"""A decision place as each engine's wire asks it: vLLM continues the assistant's start under the rest's
regex with its grammar-masked list; llama-server gets the verdict-place probe (its GBNF grammar, sampled at
temperature 1 and read after its sampler chain)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.simulator.grammar import grammar_regex
from gateway.engine.wires import wire_for
from gateway.engine.wires.gbnf import regex_to_gbnf
from shaping.decisions import answers_regex

BODY: dict[str, Any] = {
    "model": "m", "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
}


def test_vllm_asks_the_first_place_as_the_question_itself() -> None:
    probe = wire_for("vllm").decision_place(BODY, "", "(?:no|yes)", 20)
    assert probe["structured_outputs"] == {"regex": "(?:no|yes)"}
    assert (probe["max_completion_tokens"], probe["logprobs"], probe["top_logprobs"]) == (1, True, 20)
    assert probe["messages"] == BODY["messages"]
    assert "continue_final_message" not in probe


def test_vllm_continues_the_answer_so_far_as_the_assistants_start() -> None:
    probe = wire_for("vllm").decision_place(BODY, "viol", "(?:ence|ent)", 20)
    assert probe["messages"][-1] == {"role": "assistant", "content": "viol"}
    assert (probe["continue_final_message"], probe["add_generation_prompt"]) == (True, False)


def test_llamacpp_asks_a_place_probe_with_its_grammar_and_sampler_settings() -> None:
    probe = wire_for("llamacpp").decision_place(BODY, "viol", "(?:ence|ent)", 20)
    assert "structured_outputs" not in probe
    assert probe["grammar"].startswith("root ::= ")
    assert probe["post_sampling_probs"] is True
    assert probe["temperature"] == 1.0
    assert probe["messages"][-1] == {"role": "assistant", "content": "viol"}


def test_each_wire_reads_its_own_list() -> None:
    vllm = {"choices": [{"logprobs": {"content": [{"token": "yes", "logprob": -0.5, "top_logprobs": [
        {"token": "yes", "logprob": -0.5}, {"token": "no", "logprob": -1.0}]}]}}]}
    llamacpp = {"choices": [{"logprobs": {"content": [{"top_probs": [
        {"token": "yes", "prob": 0.6}, {"token": "no", "prob": 0.4}]}]}}]}
    read = wire_for("vllm").read_decision_place(vllm)
    assert read is not None
    assert [token for token, _ in read] == ["yes", "no"]
    assert wire_for("llamacpp").read_decision_place(llamacpp) == (("yes", 0.6), ("no", 0.4))


@pytest.mark.parametrize(("labels", "before"), [
    (["yes", "no"], ""),
    (["violence", "violent", "boolean true"], "viol"),
    (["viol", "violence"], "viol"),
    (["a.b (c)", "a|b", "x?", "50%", "[tag]"], ""),
])
def test_the_answer_grammar_as_llamacpps_gbnf_admits_exactly_the_answers_rests(
    labels: list[str], before: str
) -> None:
    grammar = grammar_regex(regex_to_gbnf(answers_regex(labels, before)))
    rests = {label[len(before):] for label in labels if label.startswith(before)}
    assert all(grammar.fullmatch(rest) for rest in rests)
    assert not grammar.fullmatch(before + "zz")
    assert not any(grammar.fullmatch(rest + "x") for rest in rests)
