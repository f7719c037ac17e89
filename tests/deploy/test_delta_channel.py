"""Delta channels without Ray (deploy/delta_channel.py): the replica's channel server and the
ingress's client over loopback, then `ServeBackend` over a replica (`LLMServerImpl`) through a
stand-in for Serve's handle that runs each call in a task of its own, as Ray does: the tokens
come by the channel, in order, in fewer frames than messages; a cancelled call aborts the
request; an engine that dies, a replica that goes away, a wrong token: each a clear error."""
from __future__ import annotations

import asyncio

import pytest
from stream_fakes import WORDS, StepEngine, paced_engine

from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.delta_channel import ChannelAddress, ChannelClient, ChannelLost, ChannelServer
from hybrid_serve.deploy.errors import ENGINE_DEAD, REPLICA_FAILED, APIError, GenerateError
from hybrid_serve.deploy.ingress import ServeBackend
from hybrid_serve.deploy.replica_calls import call_replicas
from hybrid_serve.deploy.server import GenerateRequest, LLMServerImpl, Started
from hybrid_serve.engine.async_engine import RequestDelta
from hybrid_serve.engine.sampling_params import SamplingParams

HOST = "127.0.0.1"


async def _get(queue: asyncio.Queue, timeout_s: float = 5.0):
    return await asyncio.wait_for(queue.get(), timeout_s)


def test_items_posted_before_the_ingress_connects_arrive_in_order_one_frame_a_pass():
    async def run():
        server, client = ChannelServer(), ChannelClient("ingress:a")
        address = await server.start(HOST)
        key, queue = client.register()
        for k in range(3):  # the replica's first tokens may come before the ingress reads Started
            server.post("ingress:a", key, ("early", k))
        await client.attach(key, address)
        assert [await _get(queue) for _ in range(3)] == [("early", k) for k in range(3)]
        streams = [client.register() for _ in range(5)]
        for other_key, _ in streams:
            await client.attach(other_key, address)
        frames = server.num_frames
        for step in range(10):  # one pass of the loop: 10 items for each of 5 streams, and a stale key
            for other_key, _ in streams:
                server.post("ingress:a", other_key, step)
        server.post("ingress:a", 999, "for a stream that has ended")
        for other_key, other_queue in streams:
            assert [await _get(other_queue) for _ in range(10)] == list(range(10))
        assert server.num_frames == frames + 1
        await client.close()
        await server.close()

    asyncio.run(run())


def test_a_wrong_token_and_a_replica_gone_fail_the_streams_on_the_channel():
    async def run():
        server, client = ChannelServer(), ChannelClient("ingress:b")
        address = await server.start(HOST)
        key, queue = client.register()
        await client.attach(key, ChannelAddress(address.host, address.port, "not-the-token"))
        assert isinstance(await _get(queue), ChannelLost)  # the server closed the connection
        client.unregister(key)

        key, queue = client.register()
        await client.attach(key, address)
        server.post("ingress:b", key, "a token")
        assert await _get(queue) == "a token"
        await server.close()  # the replica went away
        lost = await _get(queue)
        assert isinstance(lost, ChannelLost)
        key, _ = client.register()
        with pytest.raises(ChannelLost, match="cannot reach"):  # nothing listens there now
            await client.attach(key, address)
        await client.close()

    asyncio.run(run())


class _Call:
    """Stands in for Serve's streaming response: the replica's generator runs in a task of its
    own (as in its replica's process), its items queued for the caller; `cancel()` cancels it."""

    def __init__(self, agen) -> None:
        self.items: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._pump(agen))
        self.cancelled, self.dead = False, False

    async def _pump(self, agen) -> None:
        try:
            async for item in agen:
                self.items.put_nowait(("item", item))
            self.items.put_nowait(("end", None))
        except asyncio.CancelledError:
            if self.dead:  # what Ray raises to the caller of a replica that died
                from ray.exceptions import ActorDiedError
                self.items.put_nowait(("error", ActorDiedError()))
            else:
                self.items.put_nowait(("error", RuntimeError("the call was cancelled")))
            raise
        except Exception as exc:  # noqa: BLE001 - the caller's
            self.items.put_nowait(("error", exc))

    def __aiter__(self):
        return self

    async def __anext__(self):
        kind, value = await self.items.get()
        if kind == "item":
            return value
        if kind == "end":
            raise StopAsyncIteration
        raise value

    def cancel(self) -> None:
        self.cancelled = True
        self.task.cancel()

    def die(self) -> None:
        self.dead = True
        self.task.cancel()


class _Handle:
    """`handle.options(stream=True).generate.remote(request)` over one in-process replica."""

    def __init__(self, impl: LLMServerImpl) -> None:
        self.impl = impl
        self.calls: list[_Call] = []

    def options(self, stream: bool):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request: GenerateRequest) -> _Call:
        call = _Call(self.impl.generate(request))
        self.calls.append(call)
        return call


async def _replica(engine, **config) -> LLMServerImpl:
    impl = LLMServerImpl(AppConfig(**config), "r0", engine_factory=lambda c, r: engine)
    await impl.start_channel_server(HOST)
    return impl


def _request(rid: str, tokens: int) -> GenerateRequest:
    return GenerateRequest(rid, [1, 2, 3], SamplingParams(max_tokens=tokens))


async def _items(backend: ServeBackend, request: GenerateRequest) -> list:
    return [item async for item in call_replicas(backend, request, max_replicas=1)]


async def _streaming(rid: str, channel_id: str):
    """A replica over a paced engine (1,000 tokens, steps of 10 ms), the backend's stream of one
    request to it, read up to its first delta (by the channel)."""
    eng = paced_engine(1000, 0.01)
    impl = await _replica(eng)
    handle = _Handle(impl)
    backend = ServeBackend(handle, ChannelClient(channel_id))
    stream = backend.generate(_request(rid, 1000))
    started, first = await stream.__anext__(), await stream.__anext__()
    assert isinstance(started, Started) and started.channel == impl.channel_server.address
    assert isinstance(first, RequestDelta)
    return eng, impl, handle, backend, stream


@pytest.mark.parametrize("engine", ["paced", "delta_by_delta"])
def test_tokens_come_by_the_channel_equal_to_the_call_path_in_fewer_frames(engine):
    tokens, streams = 12, 16

    def make():
        return paced_engine(tokens, 0.01) if engine == "paced" else StepEngine(tokens, 0.002)

    async def run(channels: bool):
        eng = make()
        impl = await _replica(eng)
        backend = ServeBackend(_Handle(impl), ChannelClient("ingress:c") if channels else None)
        try:
            results = await asyncio.gather(*(_items(backend, _request(f"q{i}", tokens)) for i in range(streams)))
            frames = impl.channel_server.num_frames
        finally:
            await impl.channel_server.close()
            eng.shutdown()
        return results, frames

    by_channel, frames = asyncio.run(run(True))
    by_call, _ = asyncio.run(run(False))
    for channel_items, call_items in zip(by_channel, by_call):
        assert isinstance(channel_items[0], Started) and channel_items[0].channel is not None
        assert isinstance(call_items[0], Started) and call_items[0].channel is None
        for items in (channel_items, call_items):
            deltas = items[1:]
            assert all(isinstance(d, RequestDelta) for d in deltas)
            assert [t for d in deltas for t in d.seqs[0].token_ids] == [100 + k for k in range(tokens)]
            assert "".join(d.seqs[0].text for d in deltas) == "".join(WORDS[k % len(WORDS)] for k in range(tokens))
            assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
    messages = sum(len(items) - 1 for items in by_channel)
    assert 0 < frames <= messages / 2  # 16 streams' deltas share frames (a frame each: as many as messages)


def test_a_closed_stream_cancels_its_call_and_aborts_the_request():
    async def run():
        eng, impl, handle, backend, stream = await _streaming("gone", "ingress:d")
        await stream.aclose()  # the client went away
        for _ in range(200):
            if eng.backend.aborted:
                break
            await asyncio.sleep(0.01)
        aborted, cancelled = list(eng.backend.aborted), handle.calls[0].cancelled
        assert not backend.channels.queues  # its stream key is gone
        await impl.channel_server.close()
        eng.shutdown()
        return aborted, cancelled

    aborted, cancelled = asyncio.run(run())
    assert cancelled and aborted == ["gone"]


def test_an_engine_that_dies_mid_stream_is_an_error_by_the_channel():
    async def run():
        eng, impl, _, _, stream = await _streaming("dies", "ingress:e")
        items = []
        eng.backend.stopping.set()
        eng._on_exit(RuntimeError("a step failed"))
        async for item in stream:
            items.append(item)
        await impl.channel_server.close()
        eng.shutdown()
        return items

    items = asyncio.run(run())
    assert all(isinstance(item, RequestDelta) for item in items[:-1])
    assert isinstance(items[-1], GenerateError) and items[-1].code == ENGINE_DEAD and items[-1].replica == "r0"


def test_a_replica_gone_mid_stream_fails_the_request_as_a_failed_replica():
    async def run():
        eng, impl, handle, _, stream = await _streaming("orphan", "ingress:f")
        await impl.channel_server.close()  # the replica's process is gone: its channel and its call
        handle.calls[0].die()
        try:
            with pytest.raises(APIError) as failed:
                async for _ in stream:
                    pass
        finally:
            eng.shutdown()
        return failed.value

    failed = asyncio.run(run())
    assert failed.code == REPLICA_FAILED and failed.status_code == 503


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def test_an_ingress_that_cannot_reach_any_channel_streams_through_the_calls():
    """A firewall that lets Ray through but not the replicas' channel ports: the first request
    is retried as one whose replica failed, the ingress stops asking for channels, and the
    tokens come in the Serve calls. Once a channel has worked, an unreachable one is a failed
    replica only (channels stay on)."""
    async def run():
        eng = paced_engine(6, 0.01)
        impl = await _replica(eng)
        good = impl.channel_server.address
        impl.channel_server.address = ChannelAddress(HOST, _closed_port(), good.token)  # nothing listens there
        backend = ServeBackend(_Handle(impl), ChannelClient("ingress:g"))
        items = await _items(backend, _request("walled", 6))
        fell_back = backend.channels is None

        impl.channel_server.address = good
        backend = ServeBackend(_Handle(impl), ChannelClient("ingress:h"))
        assert isinstance((await _items(backend, _request("ok", 6)))[0].channel, ChannelAddress)
        impl.channel_server.address = ChannelAddress(HOST, _closed_port(), good.token)
        with pytest.raises(APIError) as failed:  # one replica only here: its attempts all fail
            await _items(backend, _request("gone", 6))
        kept = backend.channels is not None
        await impl.channel_server.close()
        eng.shutdown()
        return items, fell_back, kept, failed.value

    items, fell_back, kept, failed = asyncio.run(run())
    assert fell_back and kept and failed.code == REPLICA_FAILED
    assert isinstance(items[0], Started) and items[0].channel is None  # the retry asked for no channel
    assert [t for d in items[1:] for t in d.seqs[0].token_ids] == [100 + k for k in range(6)]
