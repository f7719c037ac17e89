"""Placement across replicas: Ray-free policies (`policy.py`), the per-replica prefix
index contract (`prefix_index.py`), the index every router shares (`shared_index.py`) and
the cluster-wide suffix index for speculative drafts (`suffix_index.py`). Plain classes;
the Serve RequestRouter (deploy/) and the Router actor (actors/) wrap them, so everything
here is testable without Ray."""
from .policy import Placement, PlacementPolicy, PowerOfTwoChoices, PrefixAwarePolicy, ReplicaStats, RoutingRequest
from .prefix_index import BlockPrefixIndex, PrefixIndex, block_hashes, cache_event
from .suffix_index import SuffixIndex

__all__ = ["BlockPrefixIndex", "Placement", "PlacementPolicy", "PowerOfTwoChoices", "PrefixAwarePolicy", "PrefixIndex",
           "ReplicaStats", "RoutingRequest", "SuffixIndex", "block_hashes", "cache_event"]
