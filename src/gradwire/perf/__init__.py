"""Performance model: predicted iteration time of data-parallel training for any model profile,
cluster and aggregation scheme, from the schedules' α-β-γ cost (see docs/performance-model.md).

- :mod:`.profiles`: the profile format (per-tensor sizes in backward order, compute times, sources)
  and the built-in profiles; :mod:`.architectures` derives their parameter lists.
"""
