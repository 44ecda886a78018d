"""The admin API's HTTP server: uvicorn on the node's own event loop.

The only module that imports uvicorn. The daemon owns SIGTERM/SIGINT (it drains the data
plane and syncs the stores before exiting), so uvicorn's own signal capture is switched
off; the daemon stops this server by setting `should_exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

import uvicorn

STOP_WAIT_S_MAX = 5.0
START_WAIT_S_MAX = 10.0


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # signals belong to the daemon


class AdminServer:
    def __init__(self, app: Any, host: str, port: int) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            # No handlers of uvicorn's own: its lines go through the root logger, in the
            # node's format (text or JSON lines, logsvc/logs.py).
            log_config=None,
            access_log=False,
            lifespan="off",
            limit_concurrency=256,  # bounded: more connections get 503
            timeout_keep_alive=5,
        )
        # uvicorn's loggers may carry handlers of their own from an earlier uvicorn in the
        # same process (its default log_config sets them and stops propagation): route
        # them to the root logger again, so every line has the node's format.
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            uvicorn_log = logging.getLogger(name)
            uvicorn_log.handlers.clear()
            uvicorn_log.propagate = True
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        deadline = asyncio.get_running_loop().time() + START_WAIT_S_MAX
        while not self._server.started:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the admin server did not start in {START_WAIT_S_MAX} s")
            if self._task.done():
                self._task.result()  # bind failure and the like: raise it here
                raise RuntimeError("the admin server stopped during start-up")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, STOP_WAIT_S_MAX)
