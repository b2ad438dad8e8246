"""Performance model: predicted iteration time of data-parallel training for any model profile,
cluster and aggregation scheme, from the schedules' α-β-γ cost (docs/performance-model.md).

- :mod:`.comm`: collective time from cached schedule summaries; :mod:`.codecs`: encode/decode;
- :mod:`.model`: buckets, overlap and the iteration time; :mod:`.whatif` and :mod:`.advise`:
  the sweeps and the ranking behind ``gradwire whatif`` and ``gradwire advise``.
"""
