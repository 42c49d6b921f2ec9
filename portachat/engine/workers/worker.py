"""A tensor-parallel worker: `python -m portachat.engine.workers.worker OPTIONS_JSON` (started by rank 0).

Joins the process group, loads its shard, then runs the steps rank 0 broadcasts until told to stop.
It leaves when its parent is gone, and ignores Ctrl-C (the terminal sends it to the whole process
group; rank 0 decides how everyone stops).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from portachat.device import get_device
from portachat.device.dist import destroy_distributed, dist_env, init_distributed, private_store
from portachat.engine.loading import LoadOptions
from portachat.engine.workers.group import replica_groups, worker_place
from portachat.engine.workers.load import load_shard
from portachat.engine.workers.tp_runner import serve_steps

STORE_TIMEOUT_S = 600

def _watch_parent(parent: int) -> None:
    # Reparented (the server died, even by SIGKILL): nobody will send a stop; leave at once.
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = int(os.environ.get("PORTACHAT_TP_PARENT", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()

    options = LoadOptions(**json.loads(argv[0]))
    device = get_device(kind=options.device, dtype=None, compile=False)
    # The rendezvous store rank 0 made: a file in its private directory (nothing listens on the network).
    env = dist_env()
    store, _dir = private_store(env.world_size, os.environ["PORTACHAT_TP_STORE"], STORE_TIMEOUT_S)
    tp, dp = options.tensor_parallel_size, options.data_parallel_size
    init_distributed(device, env=env, store=store, bind_device=dp == 1, loopback=True)
    replica, rank = worker_place(env.rank, tp)
    groups = replica_groups(tp, dp)
    loaded = load_shard(options, device, rank, tp, None if groups is None else groups[replica])
    serve_steps(loaded.model, device.torch_device)
    destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
