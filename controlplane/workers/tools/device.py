"""The worker's tools on its ticket's device, through the gateway: ``shell``, its jobs
(``job_output``, ``stop``), the file tools (``view``, ``edit``, ``create_file``:
:mod:`~controlplane.workers.tools.files`), the finding tools (``search``, ``glob``:
:mod:`~controlplane.workers.tools.search`), and whole files (``read_file``, ``write_file``,
``list_dir``, ``apply_patch``).

Asynchronous ReAct: ``shell`` waits at most ``foreground_seconds``; a command still running
then becomes a background job, and its completion reaches the worker later as an event, so
a long build never blocks the session and the worker can do other things meanwhile.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from controlplane.gateway import specs
from controlplane.tickets import output
from controlplane.tools.fields import ID_CHARS, NON_BLANK, Arguments, id_of
from controlplane.tools.problems import rule_problem
from controlplane.tools.registry import Refused
from controlplane.workers.tools import files, search
from controlplane.workers.tools.core import Call, Limit, Offset, WorkerTools
from controlplane.workers.tools.fileops import FILE_WAIT_SECONDS, failed, file_op
from controlplane.workers.tools.shell_syntax import program_argv

MAX_WRITE_BYTES = 5_000_000

_jobs = WorkerTools()  # shell and its jobs
_whole = WorkerTools()  # whole files: read, write, list, patch

Path = Annotated[str, Field(max_length=4096), NON_BLANK]
Cwd = Annotated[str | None, Field(max_length=200_000)]
JobId = Annotated[str, Field(max_length=ID_CHARS), id_of("cmd")]


class Credential(Arguments):
    name: str
    delivery: specs.DeliveryName
    env_var: str | None = None

    @model_validator(mode="after")
    def _env_var_where_needed(self) -> Self:
        if self.delivery in ("env", "file") and not self.env_var:
            raise rule_problem(f"credential {self.name!r}: {self.delivery} delivery needs env_var")
        return self


class Shell(Arguments):
    command: Annotated[str, Field(max_length=100_000), NON_BLANK]
    cwd: Annotated[
        Cwd, Field(description="Directory; default: the ticket's working directory.")
    ] = None
    timeout_seconds: Annotated[
        int | None, Field(ge=0, le=7 * 24 * 3600, description="Kill it after this long (0: none).")
    ] = None
    credentials: Annotated[
        list[Credential] | None,
        Field(
            description="Credentials the device injects by name (you never see values): "
            "env (into env_var), file (a 0600 file whose path is in env_var), git_helper (git "
            "authenticates with it over https; env_var: the git username, optional) or http "
            "(added to the command's HTTPS requests to the credential's hosts; no env_var). "
            "The device's owner decides which programs may use each."
        ),
    ] = None


@_jobs.tool(
    "shell",
    "Run a shell command on the device (sh -c, in the ticket's directory). Waits a few "
    "seconds; a longer one becomes a background job whose completion arrives later as an "
    "event (job_output, stop). With credentials there is no sh: the command is one "
    "program with its arguments (e.g. git push origin HEAD), without pipes, redirects, "
    "&&, ;, $(...), globs, variables or cd (use cwd).",
)
async def shell(call: Call, args: Shell) -> dict[str, Any]:
    bench = call.bench
    cwd = args.cwd or bench.ticket.workdir or ""
    credentials = [
        specs.credential(c.name, c.delivery, c.env_var or "") for c in args.credentials or ()
    ]
    # Credential scopes match the program actually run, and `sh -c "git push"` runs sh:
    # with credentials, the command is the program's own argv.
    argv = program_argv(args.command) if credentials else ["sh", "-c", args.command]
    spec = specs.Exec(
        argv=argv,
        cwd=bench.path(cwd) if cwd else "",
        timeout_seconds=args.timeout_seconds or 0,
        credentials=credentials,
    )
    result = await bench.run(
        spec, bench.settings.foreground_seconds, call_id=call.id, script=args.command
    )
    return output.describe(result) if result.done else bench.pending(result)


async def _owned_job(call: Call, job: str) -> str:
    owned = await call.bench.pool.fetchval(
        "SELECT 1 FROM commands WHERE id = $1 AND ticket_id = $2", job, call.bench.ticket.id
    )
    if not owned:
        raise Refused(f"no job {job} in this ticket")
    return job


class JobOutput(Arguments):
    job: JobId
    offset: Offset = None
    limit: Limit = None


@_jobs.tool("job_output", "Read a job's state and a slice of its output.")
async def job_output(call: Call, args: JobOutput) -> dict[str, Any]:
    return await read_job(call, args.job, args.offset, args.limit)


async def read_job(call: Call, job: str, offset: int | None, limit: int | None) -> dict[str, Any]:
    """A job of this ticket's: its state, and ``limit`` bytes of its output from ``offset``."""
    queue = call.bench.queue
    await _owned_job(call, job)
    offset = offset or 0
    result = await queue.result(job)
    data = await queue.output(job, offset, 8000 if limit is None else limit)
    described = {k: v for k, v in output.describe(result).items() if "output" not in k}
    described.pop("read_more", None)
    described.pop("omitted_bytes", None)
    end = offset + len(data)
    return {
        **described,
        "offset": offset,
        "output": data.decode("utf-8", errors="replace"),
        "size": result.output_size,
        **({"next_offset": end} if end < result.output_size else {}),
    }


class Job(Arguments):
    job: JobId


@_jobs.tool("stop", "Stop a running job.")
async def stop(call: Call, args: Job) -> dict[str, Any]:
    job = await _owned_job(call, args.job)
    result = await call.bench.queue.cancel(job, grace_seconds=5)
    return {"job": job, "state": result.state, "note": "stopping" if not result.done else ""}


class ReadFile(Arguments):
    path: Path
    offset: Offset = None
    limit: Annotated[int | None, Field(ge=1, le=1_000_000)] = None


@_whole.tool("read_file", "Read a file on the device (relative paths: from the working directory).")
async def read_file(call: Call, args: ReadFile) -> dict[str, Any]:
    path, offset = call.bench.path(args.path), args.offset or 0
    limit = 64_000 if args.limit is None else args.limit
    result = await file_op(call, specs.ReadFile(path, offset, limit))
    if not result.done:
        return call.bench.pending(result)
    if not result.ok:
        return failed(path, result)
    described = output.inline(result.output_head, result.output_tail, result.output_size, result.id)
    return {"path": path, "offset": offset, **described}


class WriteFile(Arguments):
    path: Path
    content: Annotated[str, Field(max_length=MAX_WRITE_BYTES)]


@_whole.tool("write_file", "Write a whole file on the device (parents are created).")
async def write_file(call: Call, args: WriteFile) -> dict[str, Any]:
    path, content = call.bench.path(args.path), args.content.encode()
    result = await file_op(call, specs.WriteFile(path, content, create_parents=True))
    if not result.done:
        return call.bench.pending(result)
    if not result.ok:
        return failed(path, result)
    return {"path": path, "written_bytes": len(content)}


class ListDir(Arguments):
    path: Path
    depth: Annotated[int | None, Field(ge=1, le=5)] = None


@_whole.tool("list_dir", "List a directory on the device.")
async def list_dir(call: Call, args: ListDir) -> dict[str, Any]:
    path = call.bench.path(args.path)
    result = await file_op(call, specs.ListDir(path, args.depth or 1))
    if not result.done:
        return call.bench.pending(result)
    if not result.ok:
        return failed(path, result)
    return {
        "path": path,
        **output.inline(result.output_head, result.output_tail, result.output_size, result.id),
    }


class ApplyPatch(Arguments):
    patch: Annotated[str, Field(max_length=MAX_WRITE_BYTES), NON_BLANK]
    cwd: Cwd = None


@_whole.tool(
    "apply_patch",
    "Apply a unified diff in the working directory. All or nothing: on a conflict "
    "nothing changes and the error says where.",
)
async def apply_patch(call: Call, args: ApplyPatch) -> dict[str, Any]:
    bench, patch = call.bench, args.patch
    cwd = args.cwd or bench.ticket.workdir or ""
    # git apply is all or nothing, and works outside a repository too (like patch).
    spec = specs.Exec(
        argv=["git", "apply", "--verbose", "--whitespace=nowarn", "-"],
        cwd=bench.path(cwd) if cwd else "",
        stdin=patch.encode() if patch.endswith("\n") else (patch + "\n").encode(),
    )
    result = await bench.run(spec, FILE_WAIT_SECONDS, call_id=call.id, script="apply_patch")
    if not result.done:
        return bench.pending(result)
    described = output.describe(result)
    if result.ok:
        return {"applied": True, **{k: v for k, v in described.items() if "output" in k}}
    return {
        "applied": False,
        "error": "the patch does not apply; nothing was changed",
        **{k: v for k, v in described.items() if k not in ("state",)},
    }


# The order the model sees them in: the file and finding tools before the whole-file ones.
tools = WorkerTools(_jobs, files.tools, search.tools, _whole)
