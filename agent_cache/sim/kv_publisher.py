"""The simulated worker's KV event publisher: SGLang's ``ZmqEventPublisher``.

Same behaviour as SGLang's (``srt/disaggregation/kv_events.py``), in the release's format: a
background thread takes batches from a bounded queue and sends each on a
ZeroMQ PUB socket as ``(topic, sequence, payload)``; the endpoint is bound
when it holds ``*``, ``::``, ``ipc://`` or ``inproc://`` and connected to
otherwise; with ``replay_endpoint``, a ROUTER socket answers a request
``(identity, b"", start_seq)`` with every buffered ``(seq, payload)`` from
``start_seq`` on, then ``(-1, b"")`` (from 0.5.22 each answer carries the topic frame too). The scheduler publishes after each
prefill pass and every ``DECODE_LOG_INTERVAL`` decode passes, as SGLang's
``log_prefill_stats`` / ``log_decode_stats`` do, and whenever it has nothing
to run (SGLang 0.5.4's idle self-check, ``check_memory``, publishes too): a
start-up's or an idle ``/flush_cache``'s ``AllBlocksCleared`` goes out at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

from pydantic import BaseModel, ValidationError

from agent_cache.kv.events import (
    EventFormat,
    KVEvent,
    KVEventBatch,
    encode_batch,
    offset_endpoint_port,
    sequence_bytes,
)
from agent_cache.errors import ConfigError
from agent_cache.sim.radix import RadixCache

DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
END_SEQ = sequence_bytes(-1)


class KVEventsConfig(BaseModel):
    """``--kv-events-config``: SGLang's JSON fields and defaults."""

    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def from_cli(cls, cli_value: str) -> "KVEventsConfig":
        try:
            config = cls.model_validate_json(cli_value)
        except ValidationError as exc:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
            raise ConfigError("--kv-events-config", why) from None
        if config.publisher not in ("null", "zmq"):
            raise ConfigError("--kv-events-config", f"Unknown event publisher '{config.publisher}'")
        return config


def _bind(sock: Any, endpoint: str, wait: float = 3.0) -> None:
    """Bind, waiting out a socket this process closed a moment ago (a worker restarted in-process)."""
    import zmq

    deadline = time.monotonic() + wait
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class ZmqEventPublisher:
    """PUB socket plus an optional ROUTER replay socket, served by one thread."""

    SHUTDOWN_TIMEOUT = 1.0

    def __init__(self, config: KVEventsConfig, attn_dp_rank: int = 0, fmt: EventFormat = EventFormat()) -> None:
        import zmq

        self._format = fmt

        self._rank = attn_dp_rank
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx: Any = zmq.Context.instance()
        endpoint = offset_endpoint_port(config.endpoint, attn_dp_rank)
        assert endpoint is not None
        self._pub: Any = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            _bind(self._pub, endpoint)
        else:
            self._pub.connect(endpoint)
        self._replay: Any = None
        replay = offset_endpoint_port(config.replay_endpoint, attn_dp_rank)
        if replay is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            _bind(self._replay, replay)
        self._topic = config.topic.encode("utf-8")
        self._seq = 0
        self._running = True
        self._thread = threading.Thread(target=self._loop, daemon=True, name="zmq-kv-publisher")
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        if not self._running:
            raise RuntimeError("Publisher is closed")
        if batch.attn_dp_rank is None:
            batch.attn_dp_rank = self._rank
        self._queue.put(batch)

    def _loop(self) -> None:
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if batch is None:
                break
            payload = encode_batch(batch, self._format.encoding)
            seq = self._seq
            self._seq += 1
            self._pub.send_multipart((self._topic, sequence_bytes(seq), payload))
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", *self._replay_topic(), sequence_bytes(seq), payload))
        self._replay.send_multipart((client, b"", *self._replay_topic(b""), END_SEQ, b""))

    def _replay_topic(self, topic: bytes | None = None) -> tuple[bytes, ...]:
        """0.5.22+ answer a replay with the topic as a frame of its own (empty in the end marker)."""
        if not self._format.replay_topic:
            return ()
        return (self._topic if topic is None else topic,)

    def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=self.SHUTDOWN_TIMEOUT + 0.5)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


class EventSink:
    """What the scheduler loop calls after each pass: publishes the cache's queued events when SGLang would."""

    def __init__(self, publisher: ZmqEventPublisher) -> None:
        self.publisher = publisher
        self._decodes = 0

    def after_pass(self, kind: str, cache: RadixCache) -> None:
        if kind == "decode":
            self._decodes += 1
            if self._decodes % DECODE_LOG_INTERVAL:
                return  # the events wait in the cache's queue, as in SGLang
        self.flush(cache.take_events())

    def idle(self, cache: RadixCache) -> None:
        """The scheduler has nothing to run: SGLang's idle self-check publishes what is queued at once
        (``self_check_during_idle`` -> ``check_memory`` -> ``_publish_kv_events``), a start-up's or a
        ``/flush_cache``'s ``AllBlocksCleared`` among them."""
        self.flush(cache.take_events())

    def flush(self, events: list[KVEvent]) -> None:
        if events:
            self.publisher.publish(KVEventBatch(time.time(), events))

    def close(self) -> None:
        self.publisher.shutdown()


def create_sink(config_json: str | None, fmt: EventFormat = EventFormat()) -> EventSink | None:
    """``--kv-events-config``: None when absent or the "null" publisher."""
    if not config_json:
        return None
    config = KVEventsConfig.from_cli(config_json)
    if config.publisher == "null":
        return None
    return EventSink(ZmqEventPublisher(config, fmt=fmt))
