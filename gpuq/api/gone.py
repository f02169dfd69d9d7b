"""What a job id that is not in the database answers (404): when retention deleted it, so, and
where it is now (`gpuq archive search ID`), rather than a bare "no job" that reads as a typo. The
archive is looked at only then, and within LOOKUP_BOUND_S (gpuq/upkeep/archived.py keeps it cheap)."""

from __future__ import annotations

import asyncio

from ..config import Settings
from ..errors import NotFound
from ..upkeep.archived import Archived, index_of

# Past this the 404 answers without the archive's word (the lookup goes on, and its reading is
# kept for the next ask): a GET is answered within its bound (inputs.READ_BOUND_S) whatever the disk does.
LOOKUP_BOUND_S = 2.0


async def not_in_database(settings: Settings, job_id: str) -> NotFound:
    found = await in_archive(settings, job_id)
    if found is not None:
        return NotFound(
            f"job {job_id} is not in the database: retention deleted it; the archive has it "
            f"(archived {found.archived_at[:10]}): gpuq archive search {job_id}"
        )
    if settings.retention_delete_after_s is None:
        return NotFound(f"no job with id '{job_id}'")
    if settings.retention_archive is None:
        return NotFound(
            f"no job with id '{job_id}': not in the database; retention may have deleted it, and keeps "
            'no archive ([retention] archive = "off")'
        )
    return NotFound(
        f"no job with id '{job_id}': not in the database; retention may have deleted it: gpuq archive search {job_id}"
    )


async def in_archive(settings: Settings, job_id: str) -> Archived | None:
    if settings.retention_archive is None:
        return None
    lookup = asyncio.to_thread(index_of(settings.retention_archive).find, job_id)
    try:
        return await asyncio.wait_for(lookup, LOOKUP_BOUND_S)
    except TimeoutError:
        return None
