"""The router's app state: typed keys (aiohttp's AppKey) the views read it by."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..bus import Bus
from ..config import Settings
from ..node.alerts import Alerter
from ..node.backups import Backups
from ..node.dispatcher import Dispatcher
from ..node.storage import StorageWatch
from ..ops.retention import Sweeper
from ..store import Store
from .metrics import Metrics

SETTINGS = web.AppKey("settings", Settings)


STORE = web.AppKey("store", Store)


DISPATCHER = web.AppKey("dispatcher", Dispatcher)


BUS = web.AppKey("bus", Bus)


METRICS = web.AppKey("metrics", Metrics)


ALERTER = web.AppKey("alerter", Alerter)


SWEEPER = web.AppKey("sweeper", Sweeper)  # the retention sweep (gpuq/ops/retention.py)


BACKUPS = web.AppKey("backups", Backups)  # the scheduled backups ([backup])


STORAGE = web.AppKey("storage", StorageWatch)  # the storage budget ([storage])


RELOADING = web.AppKey("reloading", asyncio.Lock)  # one reload of gpuq.toml at a time
