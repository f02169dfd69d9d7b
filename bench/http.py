"""A minimal keep-alive HTTP/1.1 client for the load generator.

aiohttp's client costs more CPU per request than the router it measures, and the bench
shares two cores with the router: a client that only writes pre-encoded requests and reads
Content-Length bodies keeps the measurement about the router."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class HttpError(Exception):
    pass


class Conn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except (ConnectionError, OSError):
                pass
            self.writer = None

    def encode(self, method: str, path: str, body: Any = None) -> bytes:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(payload)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        return head.encode() + b"\r\n" + payload

    async def send(self, raw: bytes) -> tuple[int, bytes]:
        """Write one pre-encoded request, read its response (Content-Length bodies only)."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "transfer-encoding":
                raise HttpError("chunked responses are not supported by the bench client")
        if length is None:
            raise HttpError(f"response without Content-Length: {lines[0]}")
        body = await self.reader.readexactly(length)
        return status, body

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, raw = await self.send(self.encode(method, path, body))
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")
