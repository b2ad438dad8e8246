"""Prints the torchrun variables so tests can check what each rank received."""
import json
import os

keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME", "GLIBC_TUNABLES", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
