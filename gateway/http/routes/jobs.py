"""``POST /v1/jobs`` (202 and a job id), ``GET /v1/jobs/{job_id}``: keyframes moderated in the background."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter, JSONBody

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
    request: Request[Any, Any, Any],
    data: JSONBody[JobRequest],
    services: NamedDependency[Services],
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key", required=False)] = None,
) -> Response[Job]:
    """Queue one video's keyframes; the same ``Idempotency-Key`` answers the same job, never a second one."""
    caller = await services.keys.authenticate(request.headers.get("authorization"))
    job, created = await services.jobs.submit(data, caller, idempotency_key)
    headers = {} if created else {"Idempotent-Replayed": "true"}
    return Response(job, status_code=202, headers=headers)


@get("/v1/jobs/{job_id:str}", responses=error_responses(responses.JOB_READ))
async def get_job(
    request: Request[Any, Any, Any], job_id: FromPath[str], services: NamedDependency[Services]
) -> Job:
    """A job's status, and its result once finished."""
    caller = await services.keys.authenticate(request.headers.get("authorization"))
    return await services.jobs.get(job_id, caller)


ROUTES = [create_job, get_job]
