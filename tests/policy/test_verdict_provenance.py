"""Every verdict names what produced it: the engine's model, the prompt's version, the policy's version."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from cli.embedded import ThreadedServer
from deploy.keyframes import make_keyframe
from shaping.prompt import PROMPT_VERSIONS
from tests.processes import poll
from tests.support import ADMIN_TOKEN, GatewayFactory, image_input

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PROMPT = PROMPT_VERSIONS["compact"]  # the default verdict format
FRAMES = [make_keyframe("block:violence", 320, 180, seed=7), make_keyframe("allow", 320, 180, seed=8)]


def served_model(sim: ThreadedServer) -> str:
    """The model id the engine lists first."""
    model: str = httpx.get(f"{sim.url}/v1/models", timeout=10).json()["data"][0]["id"]
    return model


def provenance(details: dict[str, Any]) -> tuple[Any, ...]:
    """The fields that say what produced a verdict."""
    return (details["model"], details["prompt_version"], details["moderation_policy_version"],
            details["thinking"])


def test_fresh_reused_and_text_verdicts_name_model_prompt_and_policy_versions(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url, engine={"model_revision": "rev-7"})
    model = served_model(sim)
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        first = client.moderations.create(model="m", input=image_input(*FRAMES))  # type: ignore[arg-type]  # the client types input as its own parts; image parts are dicts
        again = client.moderations.create(model="m", input=image_input(*FRAMES))  # type: ignore[arg-type]  # the client types input as its own parts; image parts are dicts
        text = client.moderations.create(model="m", input="a sentence to judge")
    fresh = [r.model_extra["modgate"] for r in first.results]  # type: ignore[index]  # model_extra is typed optional; modgate is always there
    reused = [r.model_extra["modgate"] for r in again.results]  # type: ignore[index]  # model_extra is typed optional; modgate is always there
    judged_text = text.results[0].model_extra["modgate"]  # type: ignore[index]  # model_extra is typed optional; modgate is always there
    assert [d["reused"] for d in reused] == ["exact", "exact"]
    for details in (*fresh, *reused, judged_text):
        assert provenance(details) == (model, PROMPT, 1, "on")
        assert details["model_revision"] == "rev-7"
    httpx.put(f"{gateway.url}/admin/moderation-policy", headers=ADMIN, timeout=10,
              json={"tenants": {"x": {"review_below": 0.5}}, "reason": "a new tenant"}).raise_for_status()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        later = client.moderations.create(model="m", input=image_input(FRAMES[0]))  # type: ignore[arg-type]  # the client types input as its own parts; image parts are dicts
    assert later.results[0].model_extra["modgate"]["moderation_policy_version"] == 2  # type: ignore[index]  # model_extra is typed optional; modgate is always there


def test_a_job_result_names_model_prompt_and_policy_versions(
    start_gateway: GatewayFactory, sim: ThreadedServer
) -> None:
    gateway = start_gateway(engine_url=sim.url)
    accepted = httpx.post(f"{gateway.url}/v1/jobs", json={"video_id": "v-1", "frames": image_input(*FRAMES)},
                          timeout=30)
    assert accepted.status_code == 202, accepted.text

    def done() -> Any:
        job = httpx.get(f"{gateway.url}/v1/jobs/{accepted.json()['id']}", timeout=10).json()
        return job if job["status"] in ("succeeded", "failed") else None

    job = poll(done, 30, "the job to finish")
    assert job["status"] == "succeeded", job
    frames = [frame["modgate"] for frame in job["result"]["frames"]]
    assert [provenance(d) for d in frames] == [(served_model(sim), PROMPT, 1, "on")] * 2
