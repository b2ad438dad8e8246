"""gradwire: gradient aggregation for data-parallel training on bandwidth-limited networks."""

__version__ = "0.1.0"
