"""A calibration file's JSON (gradwire.perf.calibration) for tests that need one without
running ``gradwire calibrate``: ``doc(**fields)`` with any field replaced."""

from __future__ import annotations


def cpu(**fields: object) -> dict:
    """The shared-CPU terms of ranks on one machine's cores."""
    return {"cpu_ranks_per_machine": 2, "cores_per_machine": 2, "cpu_step_s": 1.3e-4,
            "cpu_byte_s": 3.5e-10, "cpu_share": 0.9, "cpu_sync_s": 7.7e-4,
            "cpu_sync_step_s": 7.7e-4, "cpu_slowdown": 1.0, **fields}


def codecs(methods: tuple[str, ...], numel: int = 1000, encode_s: float = 1e-5,
           decode_s: float = 1e-6) -> dict:
    """A codec table giving every method of ``methods`` the same times."""
    return {"numel": numel, "dtype": "float32", "source": "a test's",
            "methods": {m: {"params": {}, "encode_s": encode_s, "decode_s": decode_s}
                        for m in methods}}


def doc(**fields: object) -> dict:
    """2 emulated hosts on 2 cores, 1 Gbit/s links; ``fields`` replace the defaults. A
    ``world`` or ``ranks_per_node`` given without ``nodes`` (or ``beta_between``) sets them
    as calibrate does."""
    if "world" in fields or "ranks_per_node" in fields:
        per = fields.get("ranks_per_node", 1)
        nodes = fields.setdefault("nodes", -(-fields.get("world", 2) // per))  # type: ignore
        fields.setdefault("beta_between", "nodes" if nodes > 1 else "ranks of one node")
    return {
        "format": 2, "alpha_s": 2.5e-4, "alpha_call_s": 5e-4, "beta_s_per_byte": 8.4e-9,
        "beta_between": "nodes", "beta_intra_s_per_byte": None,
        "gamma_s_per_byte": 1.3e-10, "overlap_slowdown": 1.1,
        "overlap": {"model": "mlp", "backward_s": 0.05, "with_comm_s": 0.055,
                    "comm_bytes": 10**8},
        "coding_slowdown": 0.98,
        "coding": {"method": "topk", "numel": 1000, "backward_s": 0.05, "encode_s": 0.01,
                   "together_s": 0.059},
        "codecs": codecs(("dense", "topk", "gtopk", "fp16", "powersgd")), "cpu": cpu(),
        "world": 2, "ranks_per_node": 1, "nodes": 2, "backend": "gloo", "device": "cpu",
        "model": "toy", "gradwire": "0.1.0", "commit": "abc", "machine": "test",
        "command": "test", "date": "2026-11-28", "network": "emulated 2 hosts",
        "bandwidth": "1gbit", "burst_bytes": 5e5, **fields}
