"""Prints the torchrun variables so tests can check what each rank received."""
import json
import os

keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "GLIBC_TUNABLES"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
