"""The background runner of /v1/batches: validate, run, finalize; and resume after a restart.

A job goes validating -> in_progress -> finalizing -> completed, or validating -> failed (a bad
line: nothing runs), or -> cancelling -> cancelled, or in_progress -> expired (its 24-hour window
ran out, e.g. while the server was down: the lines not yet started do not run). Each answered line is appended to the job's
output or error file at once (serve/jsonl_rows.py, as `portachat generate` writes), so a server
that stops mid-batch resumes where it stopped: the lines whose custom_id is already written are
skipped, the rest run, and no custom_id is answered twice. Lines cut off by a shutdown are not
written (they run again after the restart).

Batch work stays behind interactive traffic: at most `lines_in_flight` lines of all batches run
at once (the engine's other sequences are free for interactive requests), and every line runs at
a lower scheduling priority than an interactive request (BATCH_PRIORITY), so a request that
arrives while a batch runs is admitted before the batch's waiting lines."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from portachat.i18n import _
from portachat.serve.api.batch_lines import BatchLine, output_record, read_lines, run_line
from portachat.serve.api.batch_store import ACTIVE, COMPLETION_WINDOW_S, BatchJob, BatchStore
from portachat.serve.api.documents import app_doc_store
from portachat.serve.api.state import ServerState
from portachat.serve.jsonl_rows import RowWriter, done_ids

BATCH_LINES_IN_FLIGHT = 8  # lines of all batches running at once (a quarter of the default --max-num-seqs)
BATCH_PRIORITY = 1  # vLLM's `priority` (lower runs first): interactive requests default to 0


class BatchRunner:
    def __init__(self, app: Any, store: BatchStore | None = None, lines_in_flight: int = BATCH_LINES_IN_FLIGHT) -> None:
        self.app = app
        self.store = store or BatchStore()
        self.jobs: dict[str, BatchJob] = {job.id: job for job in self.store.load_all()}
        self.tasks: dict[str, asyncio.Task] = {}
        self.lines_in_flight = lines_in_flight
        self._slots: asyncio.Semaphore | None = None

    @property
    def server(self) -> ServerState:
        return self.app.state.server

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # made on the server's loop
            self._slots = asyncio.Semaphore(self.lines_in_flight)
        return self._slots

    async def run(self) -> None:
        """For the server's lifetime: resume the jobs a restart interrupted; on shutdown stop them all
        (their finished lines are on disk)."""
        try:
            for job in list(self.jobs.values()):
                if job.status in ACTIVE and job.id not in self.tasks:
                    self.start(job)
            await asyncio.Event().wait()
        finally:
            for task in list(self.tasks.values()):
                task.cancel()

    def start(self, job: BatchJob) -> None:
        self.jobs[job.id] = job
        task = asyncio.ensure_future(self._run(job))
        self.tasks[job.id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(job.id, None) if self.tasks.get(job.id) is task else None)

    def cancel(self, job: BatchJob) -> None:
        """validating / in_progress -> cancelling; the lines running end now, then -> cancelled with the
        answers so far in the output file."""
        job.stamp("cancelling")
        self.store.save(job)
        task = self.tasks.get(job.id)
        if task is not None:
            task.cancel()
        else:
            self.start(job)

    # ------------------------------------------------------------------ one job

    async def _run(self, job: BatchJob) -> None:
        try:
            while self.server.starting:  # the models given at start-up load first
                await asyncio.sleep(0.05)
            if self.server.load_error is not None:  # every line would fail: the job waits for a working server
                return
            if job.status != "cancelling" and not await self._validate_and_run(job):
                return
            if not self.server.accepting:  # a graceful shutdown cut lines off: they run after the restart
                return
            final = "expired" if job.status == "in_progress" and expired(job) else "completed"
            await self._finish(job, "cancelled" if job.status == "cancelling" else final)
        except asyncio.CancelledError:
            if job.status != "cancelling":  # the server stops: the job resumes after the restart
                raise
            await self._finish(job, "cancelled")
        except Exception as exc:  # noqa: BLE001 - the job fails and says why; the server goes on
            print("[portachat] " + _("batch {id} failed: {error}").format(id=job.id, error=exc), file=sys.stderr,
                  flush=True)
            job.errors = [{"code": "internal_error", "message": f"{type(exc).__name__}: {exc}", "param": None,
                           "line": None}]
            job.stamp("failed")
            await run_in_threadpool(self.store.save, job)

    async def _validate_and_run(self, job: BatchJob) -> bool:
        """False when validation failed the job (nothing ran)."""
        data = await run_in_threadpool(self.store.input_path(job.id).read_bytes)
        lines, errors = await run_in_threadpool(read_lines, data, job.endpoint, self.server)
        if job.status == "validating":
            if errors:
                job.errors = errors
                job.stamp("failed")
                await run_in_threadpool(self.store.save, job)
                return False
            job.total = len(lines)
            job.stamp("in_progress")
            await run_in_threadpool(self.store.save, job)
        await self._run_lines(job, lines)
        return True

    async def _run_lines(self, job: BatchJob, lines: list[BatchLine]) -> None:
        output, errors = self.store.output_path(job.id), self.store.errors_path(job.id)
        answered = await run_in_threadpool(done_ids, output, "custom_id")
        failed = await run_in_threadpool(done_ids, errors, "custom_id")
        job.completed, job.failed = len(answered), len(failed)
        todo = [line for line in lines if line.custom_id not in answered and line.custom_id not in failed]
        writers = RowWriter(output), RowWriter(errors)
        try:
            await asyncio.gather(*(self._one(job, line, *writers) for line in todo))
        finally:
            for writer in writers:
                writer.close()

    async def _one(self, job: BatchJob, line: BatchLine, output: RowWriter, errors: RowWriter) -> None:
        async with self.slots:
            if not self.server.accepting or job.status != "in_progress" or expired(job):
                return
            status, body = await run_line(self.app, job.endpoint, job.owner, job.admin, background(line.body, job.endpoint))
        if not self.server.accepting:  # cut off by a shutdown: it runs again after the restart
            return
        if 200 <= status < 300:
            output.write(output_record(line.custom_id, status, body))
            job.completed += 1
        else:
            errors.write(output_record(line.custom_id, status, body))
            job.failed += 1

    async def _finish(self, job: BatchJob, final: str) -> None:
        """The output and error files into the Files API (purpose "batch_output"), then the final status."""
        if final == "completed":
            job.stamp("finalizing")
            await run_in_threadpool(self.store.save, job)
        store = app_doc_store(self.app)
        for path, attr, suffix in ((self.store.output_path(job.id), "output_file_id", "output"),
                                   (self.store.errors_path(job.id), "error_file_id", "errors")):
            if getattr(job, attr) is None and path.is_file() and path.stat().st_size:
                data = await run_in_threadpool(path.read_bytes)
                row = await run_in_threadpool(store.add_file, f"{job.id}_{suffix}.jsonl", data, "batch_output",
                                              job.owner)
                setattr(job, attr, row["id"])
                await run_in_threadpool(self.store.save, job)
        job.stamp(final)
        await run_in_threadpool(self.store.save, job)


def expired(job: BatchJob) -> bool:
    """Past its completion window (OpenAI's "24h"): lines not started by then are not run."""
    return time.time() >= job.created_at + COMPLETION_WINDOW_S


def background(body: bytes, endpoint: str) -> bytes:
    """A line's body at the batch priority, behind interactive requests (embeddings have no scheduler)."""
    if endpoint == "/v1/embeddings":
        return body
    return json.dumps({**json.loads(body), "priority": BATCH_PRIORITY}, ensure_ascii=False).encode()
