from .kv_pool import KVPagePool
from .manager import CacheManager, RequestAlloc
from .req_table import RequestRowTable
from .sizing import PoolSizes, size_pools
from .state_pool import StatePool, StateSpec

__all__ = [
    "CacheManager", "KVPagePool", "PoolSizes", "RequestAlloc", "RequestRowTable", "StatePool", "StateSpec",
    "size_pools",
]
