"""The router's app state: typed keys (aiohttp's AppKey) the views read it by."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..batches.service import BatchService
from ..bus import Bus
from ..config import Settings
from ..node.dispatcher import Dispatcher
from ..store import Store
from ..upkeep import Upkeep
from .metrics import Metrics

SETTINGS = web.AppKey("settings", Settings)


STORE = web.AppKey("store", Store)


DISPATCHER = web.AppKey("dispatcher", Dispatcher)


BUS = web.AppKey("bus", Bus)


METRICS = web.AppKey("metrics", Metrics)


UPKEEP = web.AppKey("upkeep", Upkeep)  # the background services: alerts, backups, storage, retention...


BATCHES = web.AppKey("batches", BatchService)  # the batch service (gpuq/batches/service.py)


RELOADING = web.AppKey("reloading", asyncio.Lock)  # one reload of gpuq.toml at a time
