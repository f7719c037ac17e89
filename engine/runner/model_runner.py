"""The shard side of a step: apply the plan's cache ops to this shard's tables and pools,
build the ForwardBatch, run the model (a pure-decode step through a CUDA graph when
captured, see cuda_graph.py), return the sampled rows' logits.

Input id -1 in a plan means "the token sampled for this request row by the previous step",
which is still on the device (`last_tokens`, indexed by request row, written by
`record_sampled`): the engine queues a step before it has read the previous step's tokens
back (engine.py, "overlap"). Only rank 0 samples; with tensor parallelism a plan with
pending ids first broadcasts rank 0's `last_tokens` to the other ranks over the TP group
(on the stream, no host sync).
"""
from __future__ import annotations

import logging

import torch
from tqdm.auto import tqdm

from ...device_io import copy_to_device, to_device
from ...distributed import broadcast_from_rank0
from ...kernels.attention import warm_up_paged_attention
from ...kernels.attention.cudnn_extend import warm_up_cudnn_extend
from ...kernels.attention.sdpa_extend import warm_up_sdpa_extend
from ...mem_cache import KVPool, RequestRowTable, StatePool, apply_cache_ops
from ...models.forward_batch import ForwardBatch
from ...models.layers.attention import PagedAttention
from ...models.layers.ops import verify_graph_defers_state
from ..sampler import warm_up_sampling
from .cuda_graph import DecodeGraphs, decode_meta
from .piecewise_graph import PiecewiseGraphs, piecewise_sizes
from .step_plan import MtpPlan, StepPlan

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_pool: KVPool, state_pool: StatePool, req_table: RequestRowTable,
                 device: torch.device | str, cuda_graph_max_batch: int = 0, warm_up_tokens: int = 0,
                 verify_tokens_per_row: int = 0, piecewise_max_tokens: int = 0) -> None:
        """cuda_graph_max_batch > 0 (CUDA only) captures decode graphs for batches up to that
        size, and with verify_tokens_per_row = K + 1 > 1 (speculative decoding with K drafts
        and a state scratch) verify graphs too; piecewise_max_tokens > 0 (CUDA only) captures
        piecewise graphs for the other steps of up to that many tokens (piecewise_graph.py);
        warm_up_tokens > 0 then runs `warm_up` (CUDA only), after the captures: the eager steps
        must fit beside the graph pools."""
        self.model = model
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.req_table = req_table
        self.device = torch.device(device)
        self.last_tokens = torch.zeros(req_table.num_rows + 1, dtype=torch.int64, device=self.device)  # [rows+1]
        self.decode_graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None
        self.num_verify_graph_steps = 0  # verify steps replayed from a graph (the rest ran eagerly)
        # the last forward was a verify graph step that left its GDN states to the next commit
        # (models/layers/ops.py verify_graph_defers_state; mem_cache/state_pool.py)
        self.deferred_verify = False
        self.piecewise: PiecewiseGraphs | None = None
        # MTP drafting reads the last forward's final hidden states ([T, H], token order)
        self.keep_hidden = getattr(model, "mtp", None) is not None
        self.last_hidden: torch.Tensor | None = None
        if cuda_graph_max_batch > 0:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
            self.use_decode_graphs(cuda_graph_max_batch)
            self.decode_graphs.capture()
            if verify_tokens_per_row > 1 and state_pool.scratch_rows > 0:
                self.use_verify_graphs(cuda_graph_max_batch, verify_tokens_per_row)
                self.verify_graphs.capture()
        if self.device.type == "cuda":
            state_pool.prepare_copies()  # a step's state copies (checkpoints, replies): compiled before ready
            if state_pool.scratch_rows > 0:
                state_pool.prepare_commit_graphs()  # speculative commits: compiled and captured before ready
        if piecewise_max_tokens > 0:
            if self.device.type != "cuda":
                raise ValueError(f"piecewise CUDA graphs need a CUDA device, got {self.device}")
            before = cuda_memory_note(self.device)
            try:
                self.use_piecewise_graphs(piecewise_max_tokens).capture()
            except torch.OutOfMemoryError as exc:
                # the pools were sized first (gpu_memory_utilization of the free memory): the
                # graphs' activations must fit in what is left (sizes that do not are skipped;
                # this is none fitting)
                raise RuntimeError(
                    f"no piecewise CUDA graph of up to {piecewise_max_tokens} tokens fits beside the cache "
                    f"(before the capture: {before}; {exc}); start with a smaller piecewise_graph_max_tokens or "
                    "gpu_memory_utilization, or with enable_piecewise_graphs=False to run these steps eagerly") from exc
            except Exception as exc:
                raise RuntimeError(f"piecewise CUDA graph capture failed ({exc!r}); start with "
                                   "enable_piecewise_graphs=False to run these steps eagerly") from exc
        if warm_up_tokens > 0 and self.device.type == "cuda":
            # last, beside every graph pool: an eager step of the largest size that does not fit
            # fails the start here, not a step while serving
            before = cuda_memory_note(self.device)
            try:
                self.warm_up(warm_up_tokens)
            except torch.OutOfMemoryError as exc:
                raise RuntimeError(
                    f"an eager step of {warm_up_tokens} tokens does not fit beside the cache and the CUDA graphs "
                    f"(before the warm-up: {before}; {exc}); start with a smaller gpu_memory_utilization or "
                    "max_num_batched_tokens") from exc
        if self.device.type == "cuda":
            logger.info("GPU memory after start-up: %s", cuda_memory_note(self.device))

    def use_decode_graphs(self, max_batch: int) -> DecodeGraphs:
        """Route decode steps of up to max_batch rows through DecodeGraphs (captured by the
        caller on CUDA; run eagerly on the same buffers otherwise, as tests do on CPU)."""
        self.decode_graphs = DecodeGraphs(self.model, max_batch, self.device, self.req_table, self.kv_pool,
                                          self.state_pool, self.last_tokens)
        return self.decode_graphs

    def use_verify_graphs(self, max_batch: int, tokens_per_row: int) -> DecodeGraphs:
        """Route verify steps of `tokens_per_row` tokens in every row (up to max_batch rows and
        the scratch's rows) through graphs (cuda_graph.py; captured by the caller on CUDA, run
        eagerly on the same buffers otherwise)."""
        self.verify_graphs = DecodeGraphs(self.model, max_batch, self.device, self.req_table, self.kv_pool,
                                          self.state_pool, self.last_tokens, tokens_per_row=tokens_per_row)
        return self.verify_graphs

    def use_piecewise_graphs(self, max_tokens: int) -> PiecewiseGraphs:
        """Route the steps that are neither decode nor graph-verify steps, of up to max_tokens
        tokens, through piecewise graphs (piecewise_graph.py; captured by the caller)."""
        limit = min(max_tokens, self.req_table.max_context)
        self.piecewise = PiecewiseGraphs(self.model, piecewise_sizes(limit), self.device, self.req_table,
                                         self.kv_pool, self.state_pool)
        return self.piecewise

    def warm_up(self, max_tokens: int) -> None:
        """Run every kind of eager step serving meets (`warm_up_plans`) before the engine says
        ready (the decode graphs' shapes run when they are captured), then the paged
        attention variants. The kernels compile once per compile-time configuration (no
        per-step values are specialized: kernels/__init__.py); the spread of token and row
        counts also lets cuBLAS load the GEMM kernels that the token counts (and the LM head's
        sampled rows) select, and the allocator reach its working set."""
        plans = warm_up_plans(min(max_tokens, self.req_table.max_context), self.state_pool.num_slots)
        for plan in tqdm(plans, desc="Warm-up (kernel shapes)", unit="shape"):
            self.execute(plan)
        attn = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        for num_q_heads in tqdm(sorted({m.num_heads for m in attn}), desc="Warm-up (attention variants)", unit="layout"):
            warm_up_paged_attention(num_q_heads, self.kv_pool.k_buffers[0], self.kv_pool.v_buffers[0],
                                    self.req_table.req_to_token)
        warm_up_sdpa_extend()  # prompt rows over a cached prefix build torch's lower-right causal mask
        # the sampler's launches at the logits' width (fp32, as the LM head gives them): greedy and
        # sampled rows (without it a first request with a temperature would compile the Gumbel kernel)
        warm_up_sampling(self.model.lm_head.vocab_size, self.device)
        # long prompt rows on cuDNN (kernels/attention/cudnn_extend.py): every padded shape's plan
        shapes = {(m.num_heads, m.num_kv_heads, m.head_dim, self.kv_pool.v_buffers[m.attn_layer_id].shape[-1], m.scale)
                  for m in attn}
        for heads, kv_heads, dim, v_dim, scale in tqdm(sorted(shapes), desc="Warm-up (cuDNN attention plans)",
                                                       unit="layout", disable=not shapes):
            warm_up_cudnn_extend(heads, kv_heads, dim, v_dim, scale, activation_dtype(self.model), self.device,
                                 min(max_tokens, self.req_table.max_context), self.req_table.max_context)
        torch.cuda.synchronize(self.device)

    def _logits_eager(self, plan: StepPlan) -> torch.Tensor | None:
        """Any step: build the batch, resolve pending input ids, forward, LM head on the sampled rows."""
        num_tokens = len(plan.input_ids)
        size = self.piecewise.padded_size(num_tokens) if self.piecewise is not None else None
        if size is None:
            fb = ForwardBatch.from_plan(plan.req_rows, plan.prefix_lens, plan.extend_lens, self.req_table,
                                        self.kv_pool, self.state_pool, plan.checkpoints)
            input_ids = to_device(plan.input_ids, torch.int64, self.device)  # [T]
        else:  # piecewise graphs: the batch padded to `size` tokens by one padding row
            fb = self.piecewise.padding_batch(size, plan.req_rows, plan.prefix_lens, plan.extend_lens,
                                              plan.checkpoints)
            input_ids = self.piecewise.input_ids[:size]  # static; the padding tokens' ids are stale, valid ids
            copy_to_device(input_ids, plan.input_ids)
        if plan.has_pending:  # a pending token is its row's only token (the scheduler never chunks past one)
            last_token_of_row, cursor = [], 0
            for n in plan.extend_lens:
                cursor += n
                last_token_of_row.append(cursor - 1)
            pending_batch_rows = [b for b, t in enumerate(last_token_of_row) if plan.input_ids[t] < 0]
            token_index = to_device([last_token_of_row[b] for b in pending_batch_rows], torch.int64, self.device)
            req_rows = to_device([plan.req_rows[b] for b in pending_batch_rows], torch.int64, self.device)
            input_ids[token_index] = self.last_tokens[req_rows]
        if size is None:
            hidden = self.model(input_ids, fb.positions, fb)  # [T, H]
        else:
            hidden = self.piecewise.run(size, fb)[:num_tokens]
        if self.keep_hidden:
            self.last_hidden = hidden
        if not plan.sample_rows:
            return None
        if plan.sample_counts:  # verify rows: the logits of each row's last `count` tokens
            cu = fb.plan.cu_seqlens
            token_index = [t for b, count in zip(plan.sample_rows, plan.sample_counts)
                           for t in range(cu[b + 1] - count, cu[b + 1])]
            return self.model.compute_logits(hidden[to_device(token_index, torch.int64, self.device)])
        sample_batch_rows = to_device(plan.sample_rows, torch.int64, self.device)
        return self.model.compute_logits(hidden[fb.logits_indices[sample_batch_rows]])  # [S, V]

    def _logits_verify_graph(self, plan: StepPlan, size: int) -> torch.Tensor:
        """A verify step from its graph: the logits of every token, in token order (what the
        eager path gives for rows that sample all their tokens)."""
        graphs, q = self.verify_graphs, self.verify_graphs.tokens_per_row
        logits = graphs.run(decode_meta(plan.req_rows, plan.prefix_lens, plan.input_ids, size, q))
        self.num_verify_graph_steps += 1
        num_tokens = len(plan.req_rows) * q
        if self.keep_hidden:
            self.last_hidden = graphs.hidden[size][:num_tokens]
        return logits[:num_tokens]

    def _logits_graph(self, plan: StepPlan, size: int) -> torch.Tensor:
        logits = self.decode_graphs.run(decode_meta(plan.req_rows, plan.prefix_lens, plan.input_ids, size))
        if self.keep_hidden:
            self.last_hidden = self.decode_graphs.hidden[size]  # rows in batch order, one token each
        if plan.sample_rows == list(range(len(plan.sample_rows))):
            return logits[: len(plan.sample_rows)]
        return logits[to_device(plan.sample_rows, torch.int64, self.device)]

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Returns fp32 logits [plan.num_logits, V], or None when nothing samples."""
        apply_cache_ops(plan.pre_ops, self.req_table, self.state_pool, deferred_verify=self.deferred_verify)
        if plan.mtp is not None:  # a drafting pass instead of a forward
            drafts = self.run_mtp(plan.mtp)
            apply_cache_ops(plan.post_ops, self.req_table, self.state_pool)
            return drafts
        if plan.has_pending:
            broadcast_from_rank0(self.last_tokens)
        logits = None
        if plan.has_forward:
            size = self.decode_graphs.padded_size(plan.extend_lens) if self.decode_graphs is not None else None
            verify_size = None
            if size is None and self.verify_graphs is not None and plan.sample_counts:
                verify_size = self.verify_graphs.verify_fits(plan.extend_lens, plan.sample_counts, plan.checkpoints)
            self.deferred_verify = verify_size is not None and \
                verify_graph_defers_state(self.state_pool, self.verify_graphs.tokens_per_row)
            if size is not None:
                logits = self._logits_graph(plan, size)
            elif verify_size is not None:
                logits = self._logits_verify_graph(plan, verify_size)
            else:
                logits = self._logits_eager(plan)
        apply_cache_ops(plan.post_ops, self.req_table, self.state_pool)
        return logits if plan.sample_rows else None

    @torch.inference_mode()
    def record_sampled(self, plan: StepPlan, tokens: torch.Tensor) -> None:
        """tokens [len(plan.sample_rows)] (device): remember them by request row, for the next
        step's pending input ids."""
        req_rows = [plan.req_rows[b] for b in plan.sample_rows]
        self.last_tokens[to_device(req_rows, torch.int64, self.device)] = tokens.to(self.device, torch.int64)

    def _mtp_batch(self, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int]) -> ForwardBatch:
        return ForwardBatch.from_plan(req_rows, prefix_lens, extend_lens, self.req_table, self.kv_pool,
                                      self.state_pool)

    @torch.inference_mode()
    def run_mtp(self, mp: MtpPlan) -> torch.Tensor | None:
        """The MTP pass after a step (models/mtp.py): extend the MTP layers' KV over the
        previous step's verified positions, then draft greedily for `draft_rows`, chaining each
        step's MTP hidden state into the next. Returns the drafts [len(draft_rows), K] (int64,
        on the device; the same on every rank: the LM head's logits are gathered), or None."""
        if not mp.req_rows:
            return None
        fb = self._mtp_batch(mp.req_rows, mp.prefix_lens, mp.extend_lens)
        hidden = self.last_hidden[to_device(mp.hidden_rows, torch.int64, self.device)]  # h_p [T, H]
        next_ids = to_device(mp.next_ids, torch.int64, self.device)  # x_{p+1} [T]
        mtp_hidden = self.model.mtp_forward(next_ids, hidden, fb.positions, fb)  # g_p [T, H]
        if not mp.draft_rows or mp.num_draft_tokens < 1:
            return None
        last = mtp_hidden[fb.logits_indices[to_device(mp.draft_rows, torch.int64, self.device)]]  # [R, H]
        drafts = [self.model.compute_logits(last).argmax(dim=-1)]  # [R] each
        req_rows = [mp.req_rows[b] for b in mp.draft_rows]
        positions = [mp.prefix_lens[b] + mp.extend_lens[b] for b in mp.draft_rows]  # the next draft's p
        for _ in range(mp.num_draft_tokens - 1):
            fb = self._mtp_batch(req_rows, positions, [1] * len(req_rows))
            last = self.model.mtp_forward(drafts[-1], last, fb.positions, fb)  # chained: this step's g
            drafts.append(self.model.compute_logits(last).argmax(dim=-1))
            positions = [p + 1 for p in positions]
        return torch.stack(drafts, dim=1)


def warm_up_plans(limit: int, num_state_slots: int) -> list[StepPlan]:
    """The warm-up's steps, all of padding tokens (request row 0: KV slot 0 and state slot 0,
    the dummies): 2 .. `limit` tokens in one row (about 1.5x apart), the same mixed with 15
    decode rows, short prompts side by side (2 .. 64 rows), several long rows (the Triton
    extend-attention kernel), and prefix-cache checkpoints inside a chunk (into free slot 1,
    rewritten before any use): past the conv window's width, and at offset 1, whose window
    taps come from the row's slot (the conv snapshot kernel's two variants; a checkpoint at a
    chunk's end is a copy after the step, no kernel)."""
    powers = [1 << i for i in range(1, 16)]
    lengths = sorted({n for n in powers + [3 * p for p in powers[2:]] if n <= limit} | {limit})
    shapes = [[n] for n in lengths] + [[n] + [1] * 15 for n in lengths if n + 15 <= limit]
    shapes += [[40] * rows for rows in (2, 3, 5, 8, 12, 20, 30, 48, 64) if 40 * rows <= limit]
    shapes += [[64] * 6] if 6 * 64 <= limit else []
    plans = [(extend_lens, []) for extend_lens in shapes]  # (extend_lens, checkpoints)
    if num_state_slots >= 1 and limit >= 3:
        n = min(64, limit)
        plans += [([n], [(0, n // 2, 1)]), ([n], [(0, 1, 1)]), ([n, 1], [(0, 1, 1)])]
    return [StepPlan(req_rows=[0] * len(lens), prefix_lens=[0] * len(lens), extend_lens=lens,
                     input_ids=[0] * sum(lens), sample_rows=list(range(len(lens))), checkpoints=checkpoints)
            for lens, checkpoints in plans]


def activation_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a model computes in: its first half-precision parameter's (fp32 without one)."""
    return next((p.dtype for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)), torch.float32)


def graph_pool_bytes(device: torch.device) -> int:
    """Bytes the allocator holds in private pools (CUDA graphs' memory) on `device`."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if seg.get("device", index) == index and tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))


def cuda_memory_note(device: torch.device) -> str:
    """The device's memory in one line (GiB): free of total, and what torch's allocator holds
    (allocated, reserved, of which in CUDA graphs' private pools)."""
    gib = 1 << 30
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    return (f"free {free / gib:.2f} of {total / gib:.2f} GiB, allocated {stats.get('allocated_bytes.all.current', 0) / gib:.2f}, "
            f"reserved {stats.get('reserved_bytes.all.current', 0) / gib:.2f} "
            f"(graph pools {graph_pool_bytes(device) / gib:.2f})")
