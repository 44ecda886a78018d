"""`python -m engine serve --config tn.toml [--standby]` and `python -m engine promote
--config tn.toml`: the TN daemon and its operator command (issue 15, decision 0007).

Start: load and check tn.toml (a problem exits 2 naming the key, no traceback); as an
active TN, first ask the peers (bounded) whether one of them is active already: a TN that
comes back after a standby took over must not take the WAL's lease back from it, so it
exits 3 with one line saying so ("restart it with --standby"). Then open the engine on its
logsvc shard (an active TN takes the lease with a new epoch, fencing any older writer; a
standby takes none and tails the WAL) with its object store (a directory, opened read-only
by a standby, or S3), and serve the CN-facing port (engine/tn/server.py).

A standby also watches the active TN (engine/tn/watch.py: status probes of the peers, each
bounded; after N rounds without an active TN within a window of a few seconds) and promotes
itself; an operator can promote it at once with `engine promote`. Promotion takes the lease
with a higher epoch; the old TN, if it is still alive, is refused its next append.

Stop: SIGTERM or SIGINT: stop accepting, let requests in flight finish (bounded), close the
engine (commits in flight complete), exit 0. A commit that finds this TN fenced (a newer TN
holds the lease) logs one line naming the new holder and exits 3; any other WAL failure
exits 4: this engine will never acknowledge another commit, so it stops serving rather
than answer errors forever. Exit 1: the engine could not be opened or served, or a standby's
tail of the WAL gave up after its bounded retries (`StandbyFailed`, engine/standby.py): a
supervisor restarts it, and the fresh open starts from the newest checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time

from engine.engine import Engine
from engine.errors import EngineError, Fenced, WalFailed
from engine.objects.store import LocalDirStore, ObjectStore
from engine.tn import limits, messages
from engine.tn.channel import Channel, probe
from engine.tn.config import ConfigError, TNConfig, load_tn
from engine.tn.errors import BadReply, Unauthorized
from engine.tn.limits import ClientOptions
from engine.tn.server import TNServer
from engine.tn.service import TNService
from engine.tn.watch import Decision, Seen, Watch
from logsvc.config import main_config_error
from tae_driver.errors import BackendFenced, DriverError

log = logging.getLogger("engine.tn")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_FENCED = 3
EXIT_WAL_FAILED = 4

CAUSES_MAX = 16
PROMOTE_TIMEOUT_S = 60.0
"""`engine promote`: the promotion reads the WAL to its end before it answers."""
FAILURE_POLL_S = 0.1
"""How often the daemon looks at `engine.failed` (a commit's failure is reported at once;
this catches one that happened in the background)."""


def serve(config_path: str, *, standby: bool) -> int:
    try:
        config = load_tn(config_path)
    except ConfigError as exc:
        return main_config_error(exc)
    from logsvc import logs

    s3 = config.objects.s3
    logs.configure(  # lines never carry a secret (logsvc/logs.py redacts them)
        node_id=f"tn@{config.listen}",
        level=config.log_level,
        log_format=config.log_format,
        secrets=(config.token,) if s3 is None else (config.token, s3.access_key, s3.secret_key),
    )
    try:
        return asyncio.run(_Daemon(config, standby).run())
    except ConfigError as exc:  # an S3 setting the store itself refused
        return main_config_error(exc)


def promote(config_path: str) -> int:
    """Ask the TN of `config_path` (at its `listen` address) to promote itself now."""
    try:
        config = load_tn(config_path)
    except ConfigError as exc:
        return main_config_error(exc)
    try:
        reply = asyncio.run(_promote(config))
    except (OSError, TimeoutError, EngineError) as exc:
        print(f"error: the TN at {config.listen} did not promote: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if reply.was_standby:
        print(f"promoted: the TN at {config.listen} is active (visible_ts {reply.visible_ts})")
    else:
        print(f"the TN at {config.listen} was active already (visible_ts {reply.visible_ts})")
    return EXIT_OK


async def _promote(config: TNConfig) -> messages.Promoted:
    options = ClientOptions(request_timeout_s=PROMOTE_TIMEOUT_S)
    channel = await Channel.open(config.listen, config.token, options)
    try:
        reply = await channel.call(messages.Promote())
    finally:
        await channel.close()
    if not isinstance(reply, messages.Promoted):
        raise BadReply(f"Promote answered with {type(reply).__name__}")
    return reply


class _Daemon:
    def __init__(self, config: TNConfig, standby: bool) -> None:
        self.config = config
        self.standby = standby
        self._fatal: BaseException | None = None
        self._wake = asyncio.Event()

    def _on_fatal(self, exc: BaseException) -> None:
        if self._fatal is None:
            self._fatal = exc
        self._wake.set()

    async def run(self) -> int:
        config = self.config
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._wake.set)
        if not self.standby:
            active = await _active_peer(config)
            if active is not None:
                log.error(
                    "TN fenced: the TN at %s is active (it took over the WAL's lease); this "
                    "one will not take it back: restart it with --standby",
                    active,
                )
                return EXIT_FENCED
        store = _object_store(config, read_only=self.standby)
        try:
            return await self._serve(store)
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    async def _serve(self, store: ObjectStore) -> int:
        config = self.config
        try:
            engine = await Engine.open(
                config.data_dir,
                wal="logsvc",
                client_config=config.client_config,
                shard=config.shard,
                objects=store,
                cache_bytes=config.cache_bytes,
                policy=config.maintenance,
                standby=self.standby,
                holder=f"tn@{config.listen}",
            )
        except (EngineError, DriverError, OSError) as exc:
            log.error("cannot open the engine on WAL shard %d: %s", config.shard, exc)
            return EXIT_FAILED
        service = TNService(engine, on_fatal=self._on_fatal)
        server = TNServer(service, config.token)
        tasks: list[asyncio.Task[None]] = []
        aborted = False
        try:
            host, _, port = config.listen.rpartition(":")
            try:
                await server.start(host.strip("[]"), int(port))
            except OSError as exc:
                log.error("cannot listen on %s: %s", config.listen, exc)
                return EXIT_FAILED
            status = service.status()
            log.info(
                "serving as %s on %s: WAL shard %d, objects %s, visible_ts %d, checkpoint_ts %d",
                status.role,
                config.listen,
                config.shard,
                _describe(store),
                status.visible_ts,
                status.checkpoint_ts,
            )
            tasks.append(asyncio.ensure_future(self._watch_failure(engine)))
            if config.peers:
                tasks.append(asyncio.ensure_future(self._watch_peers(service)))
            elif self.standby:
                log.info("no peers configured: promotion by `engine promote` only")
            await self._wake.wait()
            fatal = self._fatal
            if fatal is None:
                log.info("stopping")
                return EXIT_OK
            aborted = True
            if _fenced(fatal):
                log.error("%s", _fenced_line(fatal))
                return EXIT_FENCED
            if isinstance(fatal, WalFailed):
                log.error("TN stopped: the WAL failed (%s); exiting", fatal)
                return EXIT_WAL_FAILED
            log.error("TN stopped: %s: %s", type(fatal).__name__, fatal)
            return EXIT_FAILED
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await server.close()
            if aborted:
                await engine.abort()
            else:
                await engine.close()
            log.info("stopped")

    async def _watch_failure(self, engine: Engine) -> None:
        while True:
            failed: BaseException | None = engine.failed or engine.standby_gave_up
            if failed is not None:
                self._on_fatal(failed)
                return
            await asyncio.sleep(FAILURE_POLL_S)

    async def _watch_peers(self, service: TNService) -> None:
        """Probe the peers every interval. As a standby: promote when the rule says so
        (engine/tn/watch.py). As the active TN (from the start, or once promoted): a peer
        that says it is active too means one of the two was fenced; this one asks the log
        whether it still holds the lease, and if not fails as fenced at once (it exits 3)
        instead of answering "active" until its next append is refused."""
        policy = self.config.watch
        watch = Watch(policy)
        timeout_s = policy.probe_timeout_ms / 1000
        options = ClientOptions(connect_timeout_s=timeout_s, request_timeout_s=timeout_s)
        channels: dict[str, Channel] = {}
        token, peers = self.config.token, self.config.peers
        try:
            while True:
                answers = await asyncio.gather(
                    *(_status(channels, peer, token, options) for peer in peers)
                )
                roles = dict(zip(peers, answers, strict=True))
                engine = service.engine
                if not engine.standby:
                    if "active" in roles.values() and not await _holds_lease(engine):
                        log.warning("a peer TN is active and this one no longer holds the lease")
                        return  # the failure watch reports the fencing
                elif watch.observe(_now_ms(), _seen(self.config.listen, roles)) is Decision.PROMOTE:
                    log.warning(
                        "no active TN among %s for %d probe rounds: promoting this standby",
                        ", ".join(self.config.peers),
                        watch.failures,
                    )
                    await service.promote()
                await asyncio.sleep(policy.probe_interval_ms / 1000)
        finally:
            for channel in channels.values():
                channel.abort()


async def _holds_lease(engine: Engine) -> bool:
    """The engine's `confirm_lease`; True when the log cannot say now (asked again at the
    next probe round)."""
    try:
        return await engine.confirm_lease()
    except DriverError as exc:
        log.warning("cannot confirm this TN's lease on the WAL now: %s", exc)
        return True


def _seen(listen: str, roles: dict[str, str]) -> Seen:
    """One round's outcome for the watch: the peers' roles ("" for no answer)."""
    if "active" in roles.values():
        return Seen.ACTIVE
    if any(role == "standby" and peer < listen for peer, role in roles.items()):
        return Seen.DEFERRED
    return Seen.NO_ACTIVE


async def _status(
    channels: dict[str, Channel], address: str, token: str, options: ClientOptions
) -> str:
    """The role a peer answers with, or "" when it does not answer in time."""
    channel = channels.get(address)
    try:
        if channel is None or channel.broken:
            channel, reply = await probe(address, token, options)
            channels[address] = channel
        else:
            answer = await channel.call(messages.Status())
            assert isinstance(answer, messages.StatusReply)
            reply = answer
        return reply.status.role
    except Unauthorized:
        log.error("the peer TN at %s refuses this TN's token", address)
        return ""
    except (OSError, TimeoutError, ConnectionError, EngineError):
        dead = channels.pop(address, None)
        if dead is not None:
            dead.abort()
        return ""


async def _active_peer(config: TNConfig) -> str | None:
    """A peer that answers as active within STARTUP_PROBE_S_MAX, or None."""
    if not config.peers:
        return None
    timeout_s = limits.STARTUP_PROBE_S_MAX
    options = ClientOptions(connect_timeout_s=timeout_s, request_timeout_s=timeout_s)
    channels: dict[str, Channel] = {}
    try:
        roles = await asyncio.gather(
            *(_status(channels, peer, config.token, options) for peer in config.peers)
        )
    finally:
        for channel in channels.values():
            channel.abort()
    for peer, role in zip(config.peers, roles, strict=True):
        if role == "active":
            return peer
    return None


def _object_store(config: TNConfig, *, read_only: bool) -> ObjectStore:
    objects = config.objects
    if objects.dir is not None:
        os.makedirs(objects.dir, exist_ok=True)
        return LocalDirStore(objects.dir, read_only=read_only)
    s3 = objects.s3
    assert s3 is not None
    from engine.objects.errors import ObjectsError
    from engine.objects.s3 import S3ObjectStore

    try:
        return S3ObjectStore(
            s3.endpoint, s3.bucket, s3.prefix, s3.access_key, s3.secret_key, s3.region, s3.scheme
        )
    except ObjectsError as exc:
        raise ConfigError("objects.s3", str(exc)) from None


def _describe(store: ObjectStore) -> str:
    return str(getattr(store, "description", type(store).__name__))


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _fenced(exc: BaseException) -> bool:
    return isinstance(exc, Fenced) or _backend_fenced(exc) is not None


def _backend_fenced(exc: BaseException) -> BackendFenced | None:
    cause: BaseException | None = exc
    for _ in range(CAUSES_MAX):
        if cause is None or isinstance(cause, BackendFenced):
            break
        cause = cause.__cause__ or cause.__context__
    return cause if isinstance(cause, BackendFenced) else None


def _fenced_line(exc: BaseException) -> str:
    """One line naming who fenced this TN, when the error carries the backend's
    `BackendFenced` as a cause, else the error's own text."""
    cause = _backend_fenced(exc)
    if cause is not None:
        return (
            f"TN fenced: a newer TN took the WAL's lease (epoch {cause.current_epoch}, holder "
            f"{cause.current_holder}; this TN's epoch was {cause.epoch}); exiting"
        )
    return f"TN fenced: a newer TN took the WAL's lease ({exc}); exiting"
