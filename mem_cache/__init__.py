from .allocator import IdAllocator
from .kv_pool import KVPool
from .manager import CacheManager, CacheStats, RequestAlloc
from .ops import CacheOps, apply_cache_ops
from .radix_cache import CacheEvent, RadixCache
from .req_table import RequestRowTable
from .sizing import PoolLayout, PoolOptions, PoolSetup, PoolSizes, plan_pools, size_pools
from .state_pool import StatePool, StateSpec

__all__ = [
    "CacheEvent",
    "CacheManager", "CacheOps", "CacheStats", "IdAllocator", "KVPool", "PoolLayout", "PoolOptions", "PoolSetup",
    "PoolSizes", "RadixCache", "RequestAlloc", "RequestRowTable", "StatePool", "StateSpec", "apply_cache_ops",
    "plan_pools", "size_pools",
]
