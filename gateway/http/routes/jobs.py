"""``POST /v1/jobs`` (202 and a job id), ``GET /v1/jobs/{job_id}``: keyframes moderated in the background.

Behind the business-key guard (gateway/http/guards.py).
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter, JSONBody

from gateway.caller import Caller
from gateway.http.routes import responses
from gateway.http.routes.moderations import refuse_deep_json
from gateway.http.routes.responses import error_responses
from gateway.http.services import Services
from gateway.jobs.models import Job, JobRequest


@post(
    "/v1/jobs", status_code=202, before_request=refuse_deep_json,
    responses=error_responses(responses.JOB_SUBMIT),
)
async def create_job(
    data: JSONBody[JobRequest],
    services: NamedDependency[Services],
    caller: NamedDependency[Caller],
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key", required=False)] = None,
) -> Response[Job]:
    """Queue one video's keyframes; the same ``Idempotency-Key`` answers the same job, never a second one."""
    job, created = await services.jobs.submit(data, caller, idempotency_key)
    headers = {} if created else {"Idempotent-Replayed": "true"}
    return Response(job, status_code=202, headers=headers)


@get("/v1/jobs/{job_id:str}", responses=error_responses(responses.JOB_READ))
async def get_job(
    job_id: FromPath[str], services: NamedDependency[Services], caller: NamedDependency[Caller]
) -> Job:
    """A job's status, and its result once finished."""
    return await services.jobs.get(job_id, caller)


ROUTES = [create_job, get_job]
