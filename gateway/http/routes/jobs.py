"""``POST /v1/jobs`` (202 and a job id), ``GET /v1/jobs/{job_id}``: keyframes moderated in the background.

Behind the business-key guard (gateway/http/guards.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, HeaderParameter, JSONBody
from pydantic import ValidationError

from gateway.caller import Caller
from gateway.errors import InvalidRequest
from gateway.http import guards
from gateway.http.json_body import validate_json_body
from gateway.http.multipart_job import MultipartJob, read_multipart_job
from gateway.http.providers import services_of
from gateway.http.routes import responses
from gateway.http.routes.moderations import refuse_deep_json
from gateway.http.routes.responses import error_responses
from gateway.jobs.models import Job, JobRequest, new_job_id
from gateway.jobs.service import JobService
from gateway.jobs.video import STORED_VIDEO


async def multipart_job(request: Request[Any, Any, Any]) -> Response[Job] | None:
    """A video job as ``multipart/form-data`` (a ``video`` file part, a ``job`` JSON part of the other
    fields), answered here, its video streamed into the spool as it comes (gateway/http/multipart_job.py);
    any other body goes on to the JSON handler, its depth checked first."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        await refuse_deep_json(request)
        return None
    services = services_of(request.app)
    videos = await services.jobs.video_door()  # a video the gateway cannot take now: said before reading it
    job_id = new_job_id()
    received = await read_multipart_job(request, videos.spool, job_id)
    try:
        body = job_request(received)
    except BaseException:
        await videos.spool.discard(job_id)  # a refused job keeps no file
        raise
    # from here the job service owns the file: deleted when it refuses the job, kept when the job may be
    # stored (a store write it could not confirm), for the sweep to judge
    job, created = await services.jobs.submit(
        body, guards.caller_of(request), request.headers.get("idempotency-key"), upload=received.video
    )
    return Response(job, status_code=202, headers={} if created else {"Idempotent-Replayed": "true"})


def job_request(received: MultipartJob) -> JobRequest:
    """The job a multipart body describes: its 'job' part's fields, its video the spooled file."""
    if received.video is None:
        raise InvalidRequest("a multipart job needs a 'video' file part", param="video")
    try:
        job_fields = json.loads(received.fields or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidRequest("the 'job' part is not JSON", param="job") from exc
    if not isinstance(job_fields, dict) or "video" in job_fields or "frames" in job_fields:
        raise InvalidRequest("the 'job' part must be a JSON object of the job's fields besides its video",
                             param="job")
    # the file's bytes go to the job as they are (no data: URL made of them and decoded again); the part's
    # type is not trusted: the bytes decide
    try:
        return validate_json_body(JobRequest, {**job_fields, "video": {"url": STORED_VIDEO}})
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(f"invalid job part: {where}: {first['msg']}", param="job") from exc


@post(
    "/v1/jobs", status_code=202, before_request=multipart_job,
    responses=error_responses(responses.JOB_SUBMIT),
)
async def create_job(
    data: JSONBody[JobRequest],
    jobs: NamedDependency[JobService],
    caller: NamedDependency[Caller],
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key", required=False)] = None,
) -> Response[Job]:
    """Queue one video's keyframes; the same ``Idempotency-Key`` answers the same job, never a second one."""
    job, created = await jobs.submit(data, caller, idempotency_key)
    headers = {} if created else {"Idempotent-Replayed": "true"}
    return Response(job, status_code=202, headers=headers)


@get("/v1/jobs/{job_id:str}", responses=error_responses(responses.JOB_READ))
async def get_job(
    job_id: FromPath[str], jobs: NamedDependency[JobService], caller: NamedDependency[Caller]
) -> Job:
    """A job's status, and its result once finished."""
    return await jobs.get(job_id, caller)


ROUTES = [create_job, get_job]
