"""The local pod runtime: a process "kubelet" (and kube-proxy) for the fake GPU nodes.

One runtime per region (``hotload local runtime --region NAME``, started by ``hotload
local up``) runs the containers of our pods (``command: [hotload, …]``) as local
processes, or as agent tasks in a shared host for pods annotated
``hotload.dev/runtime: shared``; gives each pod its 127.i.x.y address, environment,
volumes and pod-bound ServiceAccount token; writes its status; finishes its deletion;
and proxies each Service on a stable local port. See ``docs/pod-runtime.md``.
"""

from hotload.local.runtime.launcher import PROCESS_NAME, runtime_process, settings_for
from hotload.local.runtime.pod_runtime import PodRuntime, read_ready, ready_file, run_runtime
from hotload.local.runtime.process_ledger import ProcessLedger
from hotload.local.runtime.service_ports import read_ports
from hotload.local.runtime.settings import RestartBackoff, RuntimeSettings

__all__ = [
    "PROCESS_NAME",
    "PodRuntime",
    "ProcessLedger",
    "RestartBackoff",
    "RuntimeSettings",
    "read_ports",
    "read_ready",
    "ready_file",
    "run_runtime",
    "runtime_process",
    "settings_for",
]
