"""The coordinator's side of the relays: one ``RelayActor`` per host that runs replicas
(``run.relays``: 'auto' leaves out the coordinator's own host, whose replicas this process
serves itself through its in-process relay).

``HostRelays`` (a part of ``RayExecutor``) makes a host's relay when the first replica lands there
(``ComponentPlaced`` names the node), hands each loop turn's ``Generate`` orders for that host
over in one call, and reads the relay's report stream: its messages are posted to the
coordinator as they came (each report's bytes kept for the event log: one encode), and its count
of finished generation calls keeps the executor's ``pending`` true while a stream it holds is open.
It is given the executor's replica table and hand-over table (replica id -> relay name, which
``TaskExecutor.send`` reads), the "down" bookkeeping (``first_down``: ``Failures.mark_down``),
``post`` (the reports, to the coordinator), ``remember`` (each report with its bytes),
``report_down`` (a replica is down: ``Failures.dead``), and the executor class each relay
actor runs its calls on (the coordinator's own: the same code).

Invariants: a replica's ``Generate`` orders all go through one relay for the replica's life;
when a relay's stream fails (its process or its host died) every replica behind it is reported
down once and retired, and the relay is forgotten — the next replica placed on that host gets a
new one; a ``ReplicaDown`` a relay reports is posted once per replica life; every relay this
executor made is killed on :meth:`close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
from ray.exceptions import RayActorError

from shunter.actors.wire import codec, root_cause
from shunter.engine.io.errors import bounded
from shunter.events import EventRejected, Message, Order, RelayReport, ReplicaDown

NAMESPACE = "shunter"


def relay_actor_name(run_id: str, node_id: str, n: int) -> str:
    return f"shunter.{run_id}.relay.{node_id[:12]}.{n}"


class HostRelays:
    def __init__(
        self,
        run_id: str,
        settings: dict[str, float] | None,
        here: bool,
        *,
        replicas: dict[str, Any],
        hand_over: dict[str, str],
        first_down: Callable[[str], bool],
        post: Callable[[list[Message]], None],
        remember: Callable[[Message, bytes], None],
        report_down: Callable[[str, str], None],
        executor_class: Callable[..., Any],
    ) -> None:
        """``settings``: the relays' ``window_s`` / ``max_events`` / ``timeout_s`` /
        ``generate_timeout_s`` (None: no relay actors — this process holds every stream);
        ``here``: a relay actor on this process's own host too."""
        self.run_id = run_id
        self.settings = settings
        self.here = here
        self.replicas, self.hand_over = replicas, hand_over
        self.first_down, self.post, self.remember, self.report_down = first_down, post, remember, report_down
        self.executor_class = executor_class
        self._here = ""  # this process's node id (its replicas need no relay actor unless ``here``)
        self._actors: dict[str, Any] = {}  # relay name -> its actor
        self._node_relay: dict[str, str] = {}  # node id -> its relay's name
        self._made: dict[str, int] = {}  # node id -> relays made there
        self._open: dict[str, int] = {}  # relay name -> Generate calls handed over and not finished
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._confirmed: set[str] = set()  # replicas their relay has acknowledged (``add``)

    def place(self, replica_id: str, node_id: str) -> None:
        """A replica landed on ``node_id``: from now on its generation goes through that host's relay."""
        if self.settings is None or not node_id or replica_id not in self.replicas:
            return
        if not self.here:
            if not self._here:
                import ray

                self._here = ray.get_runtime_context().get_node_id()
            if node_id == self._here:
                return  # served from this process: its relay is the in-process one
        name = self._node_relay.get(node_id) or self._new_relay(node_id)
        self.hand_over[replica_id] = name
        self._confirmed.discard(replica_id)
        ref = self._actors[name].add.remote(replica_id, self.replicas[replica_id])
        asyncio.get_running_loop().create_task(self._confirm(replica_id, name, ref))

    def made(self, name: str) -> bool:
        """Whether ``name`` is a relay actor of this executor (not an in-process relay)."""
        return name in self._actors

    def acknowledged(self, replica_id: str) -> bool:
        """Whether the replica's relay knows it (until then the trainer hands it no weights through it)."""
        return replica_id in self._confirmed

    async def _confirm(self, replica_id: str, name: str, ref: Any) -> None:
        """The relay knows the replica (Ray does not keep an async actor's calls in order: until
        then, orders carry its handle, and the trainer hands it no weights through the relay)."""
        try:
            await ref
        except Exception:  # noqa: BLE001 - the relay died: its stream says so
            return
        if self.hand_over.get(replica_id) == name:
            self._confirmed.add(replica_id)

    def _new_relay(self, node_id: str) -> str:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from shunter.actors import relay_actor

        assert self.settings is not None
        n = self._made[node_id] = self._made.get(node_id, -1) + 1
        name = relay_actor_name(self.run_id, node_id, n)
        s = self.settings
        handle = (
            relay_actor.remote_class()
            .options(
                name=name,
                namespace=NAMESPACE,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(
                self.run_id,
                name,
                window_s=s["window_s"],
                max_events=int(s["max_events"]),
                timeout_s=s["timeout_s"],
                generate_timeout_s=s["generate_timeout_s"],
                executor_class=self.executor_class,
            )
        )
        self._actors[name] = handle
        self._node_relay[node_id] = name
        self._open[name] = 0
        self._streams[name] = asyncio.get_running_loop().create_task(self._read(name, handle))
        return name

    def run(self, name: str, orders: list[tuple[str, Order]]) -> bool:
        """Hand a turn's orders over to relay actor ``name``; False: no such actor (an in-process
        relay, or one already gone: its replicas are down)."""
        handle = self._actors.get(name)
        if handle is None:
            return False
        self._open[name] += len(orders)
        targets = [t for t, _ in orders]
        new = {t: self.replicas[t] for t in set(targets) if t not in self._confirmed and t in self.replicas}
        handle.run.remote(targets, codec().encode_batch([o for _, o in orders]), new)
        return True

    def pending(self) -> int:
        return sum(self._open.values())

    async def _read(self, name: str, handle: Any) -> None:
        """The relay's stream, for the run: its messages to the coordinator, or its death."""
        try:
            async for ref in handle.reports.remote():
                data, done = await ref
                self._open[name] = max(0, self._open.get(name, 0) - done)
                self._ingest(name, data)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - RayActorError above all: the relay (or its host) is gone
            why = f"the relay of its host died: {root_cause(e) if not isinstance(e, RayActorError) else e}"
            self._lost(name, bounded(why))

    def _ingest(self, name: str, data: list[bytes]) -> None:
        c, out = codec(), []
        for body in data:
            try:
                msg = c.decode(body)
            except msgspec.MsgspecError as e:
                out.append(EventRejected(origin=name, error=str(e), nbytes=len(body)))
                continue
            if msg.__class__ is ReplicaDown:
                if not self.first_down(msg.replica_id):  # type: ignore[attr-defined]
                    continue  # said already (its watch, say): one ReplicaDown per replica life
            elif msg.__class__ is RelayReport:
                self.remember(msg, body)
            out.append(msg)
        if out:
            self.post(out)

    def _lost(self, name: str, why: str) -> None:
        behind = [rid for rid, r in self.hand_over.items() if r == name]
        for node, n in list(self._node_relay.items()):
            if n == name:
                del self._node_relay[node]
        self._actors.pop(name, None)
        self._open.pop(name, None)
        self._streams.pop(name, None)
        for rid in behind:
            self.hand_over.pop(rid, None)
            self._confirmed.discard(rid)
            self.report_down(rid, why)

    def close(self) -> None:
        import ray

        for task in self._streams.values():
            task.cancel()
        for handle in self._actors.values():
            try:
                ray.kill(handle)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._streams.clear()
        self._actors.clear()
