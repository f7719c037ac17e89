from .attention import PagedAttention
from .linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, copy_checked
from .norm import GatedRMSNorm, RMSNorm
from .rotary import RotaryEmbedding, rope_parameters
from .vocab import ParallelLMHead, VocabParallelEmbedding

__all__ = [
    "ColumnParallelLinear", "GatedRMSNorm", "PagedAttention", "ParallelLMHead", "RMSNorm", "ReplicatedLinear",
    "RotaryEmbedding", "RowParallelLinear", "VocabParallelEmbedding", "copy_checked", "rope_parameters",
]
