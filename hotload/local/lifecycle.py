"""``up``, ``down`` and ``status`` of the local regions: the Python API behind
``hotload local …``, used as well by the tests, the demo and the benchmarks.

``up`` plans every region (index, ports, directories), records the plan in
``regions.json``, claims the address indexes, makes certificates and kubeconfigs, then
brings the regions up side by side, each wave by wave (see ``region_processes``). Any
failure stops everything it started. ``down`` stops every process it finds a pid file
for, waits until their ports are free, and removes the state but the logs.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from urllib3.exceptions import HTTPError as Urllib3Error

from hotload.errors import ConfigError, LocalRegionError
from hotload.local import addons as addon_parts
from hotload.local import bootstrap, claims, kubeconfigs, processes
from hotload.local.components import region_processes, region_tools
from hotload.local.control_plane import kwok_stages_text
from hotload.local.locations import state_dir as default_state_dir
from hotload.local.ports import free_port, wait_ports_free
from hotload.local.processes import ProcessRecord, ProcessSpec, Wave
from hotload.local.region import (
    Region,
    RegionAddons,
    RegionPorts,
    default_names,
    validate_index,
    validate_name,
)
from hotload.local.runtime.settings import RuntimeSettings
from hotload.local.runtime.volumes import remove_memory_root
from hotload.local.state import (
    StateFile,
    kubeconfig_path,
    locked,
    read_state,
    write_json_atomically,
    write_state,
)
from hotload.local.tools import CONTROL_PLANE_TOOLS, build_tools, missing_tools, require_tools

log = logging.getLogger(__name__)

DEFAULT_NODES: Final = 2
DEFAULT_GPUS_PER_NODE: Final = 8
PORTS_FREE_TIMEOUT_S: Final = 15.0
#: What ``down`` keeps of a region directory (so a failed run can still be read).
KEPT_ON_DOWN: Final = frozenset({"logs"})


@dataclass(frozen=True)
class LocalRegions:
    """A set of running local regions and where to reach them."""

    state_dir: Path
    kubeconfig: Path
    """One context per region, named after it."""
    regions: tuple[Region, ...]

    @property
    def names(self) -> list[str]:
        return [region.name for region in self.regions]

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise ConfigError("no such local region", region=name, regions=self.names)

    def __getitem__(self, name: str) -> Region:
        return self.region(name)

    @property
    def aws_credentials_file(self) -> Path:
        """AWS credentials with a profile per region (object storage add-on)."""
        return self.state_dir / addon_parts.AWS_DIR / "credentials"

    @property
    def aws_config_file(self) -> Path:
        return self.state_dir / addon_parts.AWS_DIR / "config"


class RegionStatus(BaseModel):
    """What ``hotload local status`` reports for one region (camelCase keys in ``-o json``)."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str
    index: int
    context: str
    apiserver_url: str
    processes: dict[str, bool]
    """Process name → alive."""
    nodes_ready: int | None
    """Fake nodes Ready and schedulable (None when the apiserver does not answer)."""
    nodes_total: int | None
    services: dict[str, Any]
    """services.json: the local port of each Service (written by the pod runtime)."""

    @property
    def healthy(self) -> bool:
        return all(self.processes.values()) and self.nodes_ready == self.nodes_total


def _resolve_names(names: Sequence[str] | None, count: int | None) -> list[str]:
    if names is not None and count is not None and count != len(names):
        raise ConfigError(
            "give either region names or a count, not both", names=list(names), regions=count
        )
    chosen = list(names) if names is not None else default_names(count or 1)
    for name in chosen:
        validate_name(name)
    if len(set(chosen)) != len(chosen):
        raise ConfigError("region names must be unique", names=chosen)
    return chosen


def load(state_dir: Path | None = None) -> LocalRegions | None:
    """The regions recorded in ``state_dir`` (None when nothing was brought up there)."""
    directory = (state_dir or default_state_dir()).resolve()
    state = read_state(directory)
    if state is None:
        return None
    return LocalRegions(directory, kubeconfig_path(directory), tuple(state.regions))


def _records(region: Region) -> list[ProcessRecord]:
    return processes.read_records(region.pids_dir)


def _all_records(state_dir: Path) -> list[ProcessRecord]:
    """Every pid file under the state directory, whether or not regions.json names it."""
    records = []
    for pids_dir in sorted(state_dir.glob("*/pids")):
        records.extend(processes.read_records(pids_dir))
    return records


def _fully_up(existing: LocalRegions, expected_processes: int) -> bool:
    for region in existing.regions:
        records = _records(region)
        if len(records) < expected_processes or not all(processes.is_alive(r) for r in records):
            return False
    return True


def up(
    names: Sequence[str] | None = None,
    *,
    regions: int | None = None,
    state_dir: Path | None = None,
    nodes: int = DEFAULT_NODES,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    index_base: int = 1,
    build: bool = False,
    addons: RegionAddons | None = None,
) -> LocalRegions:
    """Bring local regions up (default ``region-1``) and return where to reach them.

    ``addons`` adds a bucket per region behind an emulated WAN link (with replication
    between the regions' buckets) and a Prometheus per region (see ``hotload.local.addons``).

    On a state directory whose regions already run with the same names, this says so and
    returns them. Regions left half-up (a crash, a killed process) are torn down and
    started afresh. Missing binaries raise :class:`~hotload.errors.ToolMissing`, unless
    ``build`` asks to run ``hack/build-tools`` first (needs a checkout and Go).
    """
    chosen = _resolve_names(names, regions)
    if nodes < 1 or gpus_per_node < 0:
        raise ConfigError(
            "need at least one node and a non-negative GPU count",
            nodes=nodes,
            gpus_per_node=gpus_per_node,
        )
    for position in range(len(chosen)):
        validate_index(index_base + position)
    extras = addons or RegionAddons()
    wanted = (*CONTROL_PLANE_TOOLS, *addon_parts.tools(extras, len(chosen)))
    if build and missing_tools(wanted):
        build_tools(addon_parts.build_groups(extras))
    tools = require_tools(wanted)
    directory = (state_dir or default_state_dir()).expanduser().resolve()
    with locked(directory):
        existing = load(directory)
        if existing is not None:
            # Count what the running regions were started with (their add-ons, not these).
            first = existing.regions[0]
            expected = len(region_processes(first, region_tools(first)))
            if existing.names == chosen and _fully_up(existing, expected):
                log.info("already up", extra={"state_dir": str(directory), "regions": chosen})
                return existing
            if existing.names != chosen and any(
                processes.is_alive(r) for r in _all_records(directory)
            ):
                raise ConfigError(
                    "other regions are up in this state directory: run `hotload local down` first",
                    state_dir=str(directory),
                    running=existing.names,
                    requested=chosen,
                )
            log.info(
                "reconciling: stopping what is left of the previous run",
                extra={"state_dir": str(directory)},
            )
        _down_locked(directory)
        planned = _plan(directory, chosen, nodes, gpus_per_node, index_base, extras)
        claims.claim({region.index: region.name for region in planned.regions}, directory)
        try:
            write_state(directory, StateFile(regions=list(planned.regions)))
            _prepare(planned)
            _start_all(planned, tools)
        except BaseException:
            log.error("up failed; stopping what was started", extra={"state_dir": str(directory)})
            _down_locked(directory, raise_on_leftovers=False)
            raise
        return planned


def _plan(
    directory: Path,
    names: list[str],
    nodes: int,
    gpus_per_node: int,
    index_base: int,
    addons: RegionAddons,
) -> LocalRegions:
    kubeconfig = kubeconfig_path(directory)
    planned = tuple(
        Region(
            name=name,
            index=index_base + position,
            directory=directory / name,
            kubeconfig=kubeconfig,
            ports=RegionPorts(
                etcd_client=free_port(),
                etcd_peer=free_port(),
                apiserver=free_port(),
                controller_manager=free_port(),
                scheduler=free_port(),
                kwok=free_port(),
                **addon_parts.ports(addons),
            ),
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            addons=addons,
        )
        for position, name in enumerate(names)
    )
    return LocalRegions(directory, kubeconfig, planned)


def _prepare(planned: LocalRegions) -> None:
    """Certificates, kubeconfigs, kwok stages and an empty services.json per region."""
    from hotload.local.certificates import make_certificates

    entries = []
    for region in planned.regions:
        region.directory.mkdir(parents=True, exist_ok=True)
        certs = make_certificates(region.certificates.directory, region.name)
        entry = kubeconfigs.KubeconfigEntry(region.name, region.apiserver_url, certs)
        kubeconfigs.write(region.admin_kubeconfig, [entry])
        entries.append(entry)
        region.kwok_stages.write_text(kwok_stages_text())
        write_json_atomically(region.services_file, {})
    kubeconfigs.write(planned.kubeconfig, entries)
    addon_parts.prepare(planned.regions, planned.state_dir)


def _start_all(planned: LocalRegions, tools: dict[str, Path]) -> None:
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(planned.regions), thread_name_prefix="region") as pool:
        futures = [pool.submit(_start_region, region, tools) for region in planned.regions]
        for future in futures:
            future.result()
    addon_parts.all_up(planned.regions, planned.state_dir)
    log.info(
        "regions up",
        extra={
            "regions": planned.names,
            "kubeconfig": str(planned.kubeconfig),
            "seconds": round(time.monotonic() - began, 1),
        },
    )


def _start_wave(region: Region, specs: list[ProcessSpec]) -> None:
    started = [(spec, processes.start(spec, region.logs_dir, region.pids_dir)) for spec in specs]
    processes.wait_ready(started, region.name)


def _start_region(region: Region, tools: dict[str, Path]) -> None:
    specs = region_processes(region, tools)
    by_wave: dict[Wave, list[ProcessSpec]] = {}
    for spec in specs:
        by_wave.setdefault(spec.wave, []).append(spec)
    for wave in Wave:
        wave_specs = by_wave.get(wave, [])
        if wave_specs:
            _start_wave(region, wave_specs)
        if wave is Wave.STORAGE:
            addon_parts.storage_ready(region)
        elif wave is Wave.API:
            bootstrap.bootstrap(region)
        elif wave is Wave.CONTROLLERS:
            bootstrap.wait_nodes_schedulable(region)


def down(state_dir: Path | None = None) -> None:
    """Stop every process of the regions in ``state_dir`` and remove their state (logs stay).

    Fine on a state directory with nothing up. Raises :class:`LocalRegionError` if a
    process or a port outlives the attempt.
    """
    directory = (state_dir or default_state_dir()).expanduser().resolve()
    if not directory.exists():
        return
    with locked(directory):
        _down_locked(directory)


def _down_locked(directory: Path, *, raise_on_leftovers: bool = True) -> None:
    try:
        state = read_state(directory)
    except LocalRegionError as err:
        log.warning("ignoring an unreadable regions.json", extra={"error": str(err)})
        state = None
    records = _all_records(directory)
    survivors = processes.stop(records)
    ports = {port for record in records for port in record.ports}
    if state is not None:
        for region in state.regions:
            ports.update(region.ports.all())
    taken = wait_ports_free(ports, PORTS_FREE_TIMEOUT_S) if records else []
    for region_dir in {path.parent for path in directory.glob("*/pids")} | {
        region.directory for region in (state.regions if state else [])
    }:
        _clear_region_dir(region_dir)
    for name in ("regions.json", "kubeconfig"):
        (directory / name).unlink(missing_ok=True)
    for name in addon_parts.STATE_DIRS:
        shutil.rmtree(directory / name, ignore_errors=True)
    released = claims.release(directory)
    if records or released:
        log.info(
            "regions down",
            extra={
                "state_dir": str(directory),
                "processes": len(records),
                "released_indexes": released,
            },
        )
    if (survivors or taken) and raise_on_leftovers:
        raise LocalRegionError(
            "some processes or ports outlived `down`",
            state_dir=str(directory),
            processes=survivors,
            ports=taken,
        )


def _clear_region_dir(region_dir: Path) -> None:
    if not region_dir.is_dir():
        return
    remove_memory_root(RuntimeSettings.pods_dir_of(region_dir))
    for child in region_dir.iterdir():
        if child.name in KEPT_ON_DOWN:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def status(state_dir: Path | None = None) -> list[RegionStatus]:
    """Each recorded region: processes alive, nodes Ready, Service ports (empty when none)."""
    existing = load(state_dir)
    if existing is None:
        return []
    return [_region_status(region) for region in existing.regions]


def _region_status(region: Region) -> RegionStatus:
    alive = {record.name: processes.is_alive(record) for record in _records(region)}
    nodes_ready: int | None = None
    nodes_total: int | None = None
    if alive.get("kube-apiserver"):
        try:
            with bootstrap.api_client(region) as api:
                nodes_ready, nodes_total = bootstrap.schedulable_nodes(api, region)
        except (ApiException, Urllib3Error, OSError) as err:
            log.warning(
                "apiserver did not answer", extra={"region": region.name, "error": str(err)[:200]}
            )
    services: dict[str, Any] = {}
    try:
        loaded = json.loads(region.services_file.read_text())
        if isinstance(loaded, dict):
            services = loaded
    except (OSError, ValueError):
        pass
    return RegionStatus(
        name=region.name,
        index=region.index,
        context=region.context,
        apiserver_url=region.apiserver_url,
        processes=alive,
        nodes_ready=nodes_ready,
        nodes_total=nodes_total,
        services=services,
    )
