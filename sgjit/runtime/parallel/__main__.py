"""A spawned tensor-parallel rank: `python -m sgjit.runtime.parallel RANK SIZE HOST PORT LOG_LEVEL
CONFIG_JSON` (started by `launch.py`; a module nothing imports, so it runs as a fresh `__main__`)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import timedelta

import torch.distributed as dist

from sgjit.runtime.config import RuntimeConfig
from sgjit.runtime.device import rank_device
from sgjit.runtime.parallel.group import TPGroup
from sgjit.runtime.parallel.worker import error_key, serve_rank, started_key
from sgjit.settings import env

log = logging.getLogger("sgjit.runtime.parallel")


def main(argv: list[str]) -> int:
    """An error ends it with status 1 and leaves its message in the store, where rank 0 reads it into
    the error it raises."""
    rank, size, host, port, level = int(argv[0]), int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    cfg = RuntimeConfig(**json.loads(argv[5]))
    logging.basicConfig(
        level=level, format=f"%(asctime)s %(levelname)s [tp rank {rank}] %(name)s: %(message)s"
    )
    store = dist.TCPStore(host, port, size, is_master=False, timeout=timedelta(seconds=60))
    try:
        store.set(started_key(rank), "1")
        group = TPGroup.join(rank, size, rank, size, store, rank_device(cfg.device, rank), env().tp_timeout_s)
        serve_rank(cfg, group)
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, then this process ends
        log.error("rank %d failed: %s", rank, e, exc_info=not isinstance(e, (KeyboardInterrupt, SystemExit)))
        try:
            store.set(error_key(rank), f"{type(e).__name__}: {e}"[:500])
        except Exception:  # noqa: BLE001 - rank 0 (the store's host) is gone
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
