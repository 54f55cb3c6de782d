"""The Apache Kafka broker: one KRaft node (broker and controller in one JVM) on loopback ports.

:func:`ensure_kafka_jars` runs Maven once on ``infra/apache-kafka/pom.xml`` to fetch the broker's jars into
``infra/apache-kafka/lib/`` (git-ignored; fetched again when the pom changes). :class:`ApacheKafkaBroker`
writes ``server.properties``, formats the storage the first time, starts ``kafka.Kafka`` with a bounded
heap and its log in a file, waits (bounded) until it answers, and stops it cleanly. Its data directory
survives :meth:`ApacheKafkaBroker.restart` and :meth:`~ApacheKafkaBroker.halt` (a stop, controlled or a
SIGKILL, that :meth:`~ApacheKafkaBroker.start` undoes), and survives :meth:`~ApacheKafkaBroker.stop` too
when the caller passed it. ``python -m infra.kafka`` runs one by hand.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from infra._process import (
    LOOPBACK,
    LoggedProcess,
    ProcessBroker,
    StartStop,
    free_port,
    log_tail,
    on_fresh_ports,
    start_answering,
    track,
    untrack,
    wait_for_signal,
)
from infra.errors import (
    BrokerStartError,
    BrokerStateError,
    DependencyFetchError,
    ToolNotFoundError,
)

#: Where the pom lives, and (by default) where its jars are copied.
KAFKA_DIR = Path(__file__).resolve().parent / "apache-kafka"
POM_PATH = KAFKA_DIR / "pom.xml"
DEFAULT_LIB_DIR = KAFKA_DIR / "lib"

#: Written into the lib dir after a complete copy: the pom's digest, so a changed pom fetches again.
_STAMP = ".pom.sha256"

#: Attempts with fresh ports when one picked was taken in between (first start only).
_PORT_ATTEMPTS = 3

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by infra/kafka.py: everything to stdout, which the launcher appends to server.log. -->
<Configuration status="warn">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="stdout"/></Root>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="state.change.logger" level="warn"/>
    <Logger name="org.apache.kafka.clients" level="warn"/>
  </Loggers>
</Configuration>
"""


def _pom_digest() -> str:
    return hashlib.sha256(POM_PATH.read_bytes()).hexdigest()


def _which(tool: str, hint: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise ToolNotFoundError(f"`{tool}` not found on PATH; {hint}")
    return found


def java_executable() -> str:
    """Return the ``java`` to run the broker with: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``.

    :raises ToolNotFoundError: when there is none.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return _which("java", "the Apache Kafka broker needs a Java 17+ runtime")


def jars_present(lib_dir: Path = DEFAULT_LIB_DIR) -> bool:
    """Whether ``lib_dir`` holds a complete copy of the jars the current pom names."""
    stamp = lib_dir / _STAMP
    return stamp.is_file() and stamp.read_text().strip() == _pom_digest()


def ensure_kafka_jars(lib_dir: Path = DEFAULT_LIB_DIR, *, timeout: float = 900.0) -> Path:
    """Make sure ``lib_dir`` holds the broker's jars; run Maven (bounded by ``timeout`` s) if not.

    Maven copies into a sibling temporary directory that is renamed into place only when complete, so
    an interrupted fetch never leaves a half-filled lib dir behind.

    :raises ToolNotFoundError: when ``mvn`` is missing.
    :raises DependencyFetchError: when Maven fails or runs out of time.
    """
    if jars_present(lib_dir):
        return lib_dir
    mvn = _which("mvn", "Maven fetches the Apache Kafka jars (apt-get install maven)")
    lib_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{lib_dir.name}.", dir=lib_dir.parent))
    try:
        command = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM_PATH),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'jars'}",
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False, cwd=KAFKA_DIR
            )
        except subprocess.TimeoutExpired as exc:
            raise DependencyFetchError(f"Maven did not fetch the Kafka jars within {timeout:g} s") from exc
        jars = staging / "jars"
        if result.returncode != 0 or not any(jars.glob("kafka_2.13-*.jar")):
            output = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise DependencyFetchError(
                f"Maven failed to fetch the Kafka jars (exit {result.returncode}): {' '.join(command)}\n{output}"
            )
        (jars / _STAMP).write_text(_pom_digest() + "\n")
        if lib_dir.exists():
            shutil.rmtree(lib_dir)
        try:
            jars.rename(lib_dir)
        except OSError:
            if not jars_present(lib_dir):  # a concurrent fetch did not win the race either
                raise
        return lib_dir
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class ClusterRole:
    """A node's place in a cluster of combined broker+controller nodes (`KafkaCluster`): its id, every
    controller (the quorum's voters, ``id@host:port``), the cluster id its storage is formatted with, and
    the replication the cluster's topics get."""

    node_id: int
    voters: str
    cluster_id: str
    replication_factor: int
    min_insync_replicas: int


def server_properties(
    *, broker_port: int, controller_port: int, log_dirs: Path, role: ClusterRole | None = None
) -> str:
    """The KRaft ``server.properties`` of a combined broker+controller node on loopback: a cluster of one,
    or a node of `role`'s cluster (its topics replicated `role.replication_factor` times by default, a
    write acknowledged by `acks=all` only once `role.min_insync_replicas` replicas hold it)."""
    replicas = str(role.replication_factor) if role is not None else "1"
    min_isr = str(role.min_insync_replicas) if role is not None else "1"
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(role.node_id) if role is not None else "1",
        "controller.quorum.voters": role.voters if role is not None else f"1@{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{broker_port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{broker_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dirs),
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Never elect a replica that missed acknowledged writes (Kafka's default, stated: a deployment relies on it).
        "unclean.leader.election.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # Two cores: keep the thread pools small.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "2",
    }
    lines = ["# Written by infra/kafka.py; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


class ApacheKafkaBroker(ProcessBroker):
    """An Apache Kafka KRaft node on two loopback ports (clients, controller), data in ``data_dir``.

    ``data_dir`` holds ``server.properties``, ``log4j2.xml``, the partition logs (``kraft/``) and the
    broker's own log (``server.log``). When not given, a temporary one is made and removed on
    :meth:`stop`; one that is given is kept, and starting on it again keeps its data.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        lib_dir: Path = DEFAULT_LIB_DIR,
        heap: str = "512m",
        start_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        fetch_timeout: float = 900.0,
        role: ClusterRole | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        self._role = role
        self._given_data_dir = data_dir
        self._lib_dir = lib_dir
        self._heap = heap
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._fetch_timeout = fetch_timeout
        self._data_dir: Path | None = None
        #: (client port, controller port); given for a cluster's node, whose peers must know them first.
        self._ports: tuple[int, int] | None = ports
        self._process: LoggedProcess | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the broker's client listener.

        :raises BrokerStateError: when the broker is not started.
        """
        if self._process is None or self._ports is None:
            raise BrokerStateError("the Apache Kafka broker is not started")
        return f"{LOOPBACK}:{self._ports[0]}"

    @property
    def client_port(self) -> int:
        """The port of the client listener (kept across `halt`/`start`).

        :raises BrokerStateError: when no port was chosen yet.
        """
        if self._ports is None:
            raise BrokerStateError("the Apache Kafka broker has no port yet")
        return self._ports[0]

    @property
    def data_dir(self) -> Path | None:
        """The data directory in use, or ``None`` before the first start."""
        return self._data_dir

    @property
    def log_path(self) -> Path | None:
        """The broker's log file (``server.log`` in the data dir), or ``None`` before the first start."""
        return self._data_dir / "server.log" if self._data_dir is not None else None

    def start(self) -> Self:
        """Fetch the jars if needed, format storage the first time, start the broker, wait until it answers.

        No-op when already started.

        :raises ToolNotFoundError: when ``java`` or ``mvn`` is missing.
        :raises DependencyFetchError: when Maven fails.
        :raises BrokerStartError: when the broker exits or does not answer within ``start_timeout``.
        """
        if self._process is not None:
            return self
        lib_dir = ensure_kafka_jars(self._lib_dir, timeout=self._fetch_timeout)
        java = java_executable()
        if self._data_dir is None:
            if self._given_data_dir is not None:
                self._given_data_dir.mkdir(parents=True, exist_ok=True)
                self._data_dir = self._given_data_dir.resolve()
            else:
                self._data_dir = Path(tempfile.mkdtemp(prefix="preflight-kafka-"))

        def launch() -> tuple[int, int]:
            ports = (free_port(), free_port())
            self._launch(java, lib_dir, ports)
            return ports

        try:
            if self._ports is not None:  # a restart: the same ports, or the clients' address changes
                self._launch(java, lib_dir, self._ports)
            else:
                self._ports = on_fresh_ports(_PORT_ATTEMPTS, launch)
        except BaseException:
            self._forget_data_dir()
            raise
        return self

    def _launch(self, java: str, lib_dir: Path, ports: tuple[int, int]) -> None:
        assert self._data_dir is not None
        data_dir = self._data_dir
        log_dirs = data_dir / "kraft"
        properties = data_dir / "server.properties"
        log4j = data_dir / "log4j2.xml"
        properties.write_text(
            server_properties(broker_port=ports[0], controller_port=ports[1], log_dirs=log_dirs, role=self._role)
        )
        log4j.write_text(_LOG4J2_XML)
        # Java expands the "lib/*" class path itself: no shell is involved.
        jvm_options = [f"-Dlog4j2.configurationFile={log4j}", "-Djava.awt.headless=true", "-cp", str(lib_dir / "*")]
        if not (log_dirs / "meta.properties").is_file():
            self._format([java, "-Xmx256m", *jvm_options], properties)
        command = [
            java,
            f"-Xmx{self._heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            *jvm_options,
            "kafka.Kafka",
            str(properties),
        ]
        self._process = start_answering(
            command,
            data_dir / "server.log",
            port=ports[0],
            what="Apache Kafka",
            start_timeout=self._start_timeout,
            stop_timeout=self._stop_timeout,
            cwd=data_dir,
        )
        track(self)

    def _format(self, java_command: list[str], properties: Path) -> None:
        """``kafka-storage.sh format``: write meta.properties and the bootstrap metadata, once."""
        assert self._data_dir is not None
        log_path = self._data_dir / "format.log"
        command = [
            *java_command,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self._role.cluster_id if self._role is not None else new_cluster_id(),
            "--config",
            str(properties),
        ]
        with open(log_path, "ab") as log:
            try:
                result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=120, check=False)
            except subprocess.TimeoutExpired as exc:
                raise BrokerStartError("formatting the KRaft storage took over 120 s", log_tail(log_path)) from exc
        if result.returncode != 0:
            raise BrokerStartError(
                f"formatting the KRaft storage failed (exit {result.returncode})", log_tail(log_path)
            )

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.stop(self._stop_timeout)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout``) and reap it.

        A temporary data dir is removed; a data dir the caller gave is kept.
        """
        try:
            self._stop_process()
        finally:
            self._forget_data_dir()
            if self._role is None:
                self._ports = None
            untrack(self)

    def halt(self, *, hard: bool = False) -> None:
        """Stop the broker process but keep its data dir and ports: :meth:`start` brings it back as it was.

        By default a controlled shutdown (SIGTERM, then SIGKILL after ``stop_timeout``); ``hard=True``
        SIGKILLs the JVM instead, a crash after which the broker recovers its logs on the next start.
        A no-op while halted.

        :raises BrokerStateError: when the broker was never started.
        """
        if self._ports is None or self._data_dir is None:
            raise BrokerStateError("halt() needs a started broker")
        process, self._process = self._process, None
        if process is None:
            return
        if hard:
            process.kill()
        else:
            process.stop(self._stop_timeout)

    def restart(self, *, hard: bool = False) -> Self:
        """Stop the broker (see :meth:`halt`) and start it again on the same ports and data dir (its data is kept).

        :raises BrokerStateError: when the broker was never started.
        """
        self.halt(hard=hard)
        return self.start()

    def _forget_data_dir(self) -> None:
        if self._data_dir is not None and self._given_data_dir is None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        self._data_dir = None

    def __repr__(self) -> str:
        where = f"{LOOPBACK}:{self._ports[0]}" if self._ports is not None else "stopped"
        return f"ApacheKafkaBroker({where})"


class KafkaCluster(StartStop):
    """``size`` Apache Kafka KRaft nodes on loopback, each a broker and a controller, forming one cluster:
    topics replicated ``replication_factor`` times by default, ``min_insync_replicas`` for an `acks=all`
    write. Nodes start together (a quorum needs a majority of its controllers up before any node answers)
    and can be stopped or SIGKILLed one by one (`ApacheKafkaBroker.halt`) and started again.
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        size: int = 3,
        replication_factor: int = 3,
        min_insync_replicas: int = 2,
        heap: str = "384m",
        start_timeout: float = 120.0,
    ) -> None:
        self._base_dir = base_dir
        self._temporary: Path | None = None
        self._size = size
        self._replication = (replication_factor, min_insync_replicas)
        self._heap = heap
        self._start_timeout = start_timeout
        self.nodes: list[ApacheKafkaBroker] = []

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address, comma-separated (a client finds the cluster from any live one)."""
        return ",".join(f"{LOOPBACK}:{port}" for port in self.client_ports)

    @property
    def client_ports(self) -> list[int]:
        if not self.nodes:
            raise BrokerStateError("the cluster is not started")
        return [node.client_port for node in self.nodes]

    def node(self, node_id: int) -> ApacheKafkaBroker:
        """The node with this `node.id` (1..size)."""
        return self.nodes[node_id - 1]

    def start(self) -> Self:
        """Fetch the jars if needed and start every node at once; return when each answers.

        :raises BrokerStartError: when a node exits or does not answer within ``start_timeout``.
        """
        if self.nodes:
            return self
        ensure_kafka_jars()
        base = self._base_dir
        if base is None:
            base = self._temporary = Path(tempfile.mkdtemp(prefix="preflight-kafka-cluster-"))
        ports = [(free_port(), free_port()) for _ in range(self._size)]
        voters = ",".join(f"{i}@{LOOPBACK}:{controller}" for i, (_, controller) in enumerate(ports, start=1))
        cluster_id = new_cluster_id()
        self.nodes = [
            ApacheKafkaBroker(
                base / f"node-{i}",
                heap=self._heap,
                start_timeout=self._start_timeout,
                role=ClusterRole(i, voters, cluster_id, *self._replication),
                ports=node_ports,
            )
            for i, node_ports in enumerate(ports, start=1)
        ]
        try:
            with ThreadPoolExecutor(max_workers=self._size) as pool:
                for started in [pool.submit(node.start) for node in self.nodes]:
                    started.result()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove a temporary base directory."""
        try:
            with ThreadPoolExecutor(max_workers=max(1, len(self.nodes))) as pool:
                list(pool.map(lambda node: node.stop(), self.nodes))
        finally:
            self.nodes = []
            if self._temporary is not None:
                shutil.rmtree(self._temporary, ignore_errors=True)
                self._temporary = None


def main(argv: list[str] | None = None) -> int:
    """Start an Apache Kafka broker, print its address, run until interrupted, then stop it."""
    parser = argparse.ArgumentParser(
        prog="python -m infra.kafka", description="Run an Apache Kafka KRaft broker on loopback."
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="keep data here (default: temporary)")
    parser.add_argument("--heap", default="512m", help="JVM heap, e.g. 512m (default)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    with ApacheKafkaBroker(args.data_dir, heap=args.heap) as broker:
        print(broker.bootstrap_servers, flush=True)
        print(
            f"Apache Kafka pid {broker.pid} up in {time.monotonic() - began:.1f} s, "
            f"log {broker.log_path}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        wait_for_signal()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
