"""A real HTTP server for the browser tests: the API app under uvicorn on a free loopback port, behind a
TCP proxy that the tests can cut, to show what the page does when its connection drops.

The proxy forwards bytes unchanged and keeps what browsers sent, so a test can read the headers of
each request (e.g. the `Last-Event-ID` a reconnecting event stream sends).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import uvicorn
from fastapi import FastAPI


class LiveServer:
    """uvicorn in a thread; `url` once started."""

    def __init__(self, app: FastAPI) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="dashboard-uvicorn")
        self.port = 0

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class CuttableProxy:
    """Loopback TCP proxy: `cut()` resets every open connection; while `paused`, new ones are reset too."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="dashboard-proxy")
        self.paused = False
        self.connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.sent: list[bytearray] = []  # what each browser connection sent, in order
        self._lock = threading.Lock()
        self.port = 0

    def start(self) -> str:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(timeout=10)
        self.server = server
        self.port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for client, upstream in list(self.connections):
                client.transport.abort()
                upstream.transport.abort()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()

    def cut(self, *, pause: bool = False) -> None:
        """Reset every open connection (the browser sees the stream break mid-response)."""
        self.paused = pause

        def abort_all() -> None:
            for client, upstream in list(self.connections):
                client.transport.abort()
                upstream.transport.abort()
            self.connections.clear()

        self.loop.call_soon_threadsafe(abort_all)

    def resume(self) -> None:
        self.paused = False

    def request_heads(self, path_pattern: str) -> list[dict[str, str]]:
        """Headers (lower-cased names) of every request whose request line matches `path_pattern`."""
        heads = []
        with self._lock:
            streams = [bytes(data) for data in self.sent]
        for data in streams:
            for match in re.finditer(rb"(GET|POST) (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n", data, re.DOTALL):
                if re.search(path_pattern, match.group(2).decode("latin-1")):
                    lines = match.group(3).decode("latin-1").split("\r\n")
                    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
                    heads.append({"method": match.group(1).decode(), "path": match.group(2).decode("latin-1"), **headers})
        return heads

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.paused:
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.transport.abort()
            return
        pair = (client_writer, upstream_writer)
        self.connections.add(pair)
        record = bytearray()
        with self._lock:
            self.sent.append(record)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray | None) -> None:
            try:
                while data := await reader.read(65536):
                    if keep is not None:
                        with self._lock:
                            keep.extend(data)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        try:
            await asyncio.gather(pipe(client_reader, upstream_writer, record), pipe(upstream_reader, client_writer, None))
        except asyncio.CancelledError:
            pass  # stop(): returning normally keeps asyncio from logging the cancellation as an error
        finally:
            self.connections.discard(pair)
