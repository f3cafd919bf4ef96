"""The training environment as the training process sees it: probe, system tools, provenance.

- `probe`: the stdlib-only probe script run by the *training* interpreter, and its JSON Lines output.
- `systools`: nvidia-smi / NVML / mthreads-gmi / rocm-smi / nsys / ncu / msys / mcu, found and parsed.
- `fixed`: perfgate's own read-only queries (argv chosen by the code, never by tool input), run with
  the executor's process-group, timeout and output rules.
- `provenance`: git commit, dirty state and diff; container facts.
- `visibility`: devices the process sees against the visibility variables and the host.
- `topology`: NVLink (nvidia-smi), RDMA ports and GPUDirect RDMA (sysfs): what DeepEP/HybridEP need.
- `fingerprint`: the facts that decide whether two measurements are comparable.
- `collect`: all of the above merged into one record, sanitised by `perfgate.security.envredactor`.
- `capture`: one collect_env call's capture: host facts, the probe run judged, the record's artifacts.

Nothing here imports torch; the probe imports it in its own process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfgate.envprobe.visibility import count_listed, visibility  # eager: the function shadows its module
from perfgate.helpers.lazy import lazy_exports

if TYPE_CHECKING:
    from perfgate.envprobe.collect import (
        SCHEMA_VERSION,
        Assembled,
        assemble,
        format_cudnn_version,
        learn_host,
        sanitize_probe_log,
    )
    from perfgate.envprobe.fingerprint import FINGERPRINT_VERSION, compare_fingerprints, make_fingerprint
    from perfgate.envprobe.models import (
        Backend,
        ContainerProvenance,
        Device,
        EnvironmentSummary,
        Fingerprint,
        FingerprintDifference,
        GitProvenance,
        Provenance,
        RdmaPort,
        SystemDevice,
        SystemTool,
        Topology,
        Unavailable,
        Visibility,
    )
    from perfgate.envprobe.probe import (
        ProbeOutput,
        is_server_interpreter,
        parse_probe_output,
        probe_script,
        probe_sha256,
        probe_source,
    )
    from perfgate.envprobe.provenance import GitSnapshot, container_provenance, git_snapshot
    from perfgate.envprobe.systools import collect_system_tools

__all__ = [
    "FINGERPRINT_VERSION",
    "SCHEMA_VERSION",
    "Assembled",
    "Backend",
    "ContainerProvenance",
    "Device",
    "EnvironmentSummary",
    "Fingerprint",
    "FingerprintDifference",
    "GitProvenance",
    "GitSnapshot",
    "ProbeOutput",
    "Provenance",
    "RdmaPort",
    "SystemDevice",
    "SystemTool",
    "Topology",
    "Unavailable",
    "Visibility",
    "assemble",
    "collect_system_tools",
    "compare_fingerprints",
    "container_provenance",
    "count_listed",
    "format_cudnn_version",
    "git_snapshot",
    "is_server_interpreter",
    "learn_host",
    "make_fingerprint",
    "parse_probe_output",
    "probe_script",
    "probe_sha256",
    "probe_source",
    "sanitize_probe_log",
    "visibility",
]

# The models, probing, system tools, provenance and assembly load on first use (a collect_env call):
# redaction (the server's log filter) and visibility above are all a server needs at start-up.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "Backend",
            "ContainerProvenance",
            "Device",
            "EnvironmentSummary",
            "Fingerprint",
            "FingerprintDifference",
            "GitProvenance",
            "Provenance",
            "RdmaPort",
            "SystemDevice",
            "SystemTool",
            "Topology",
            "Unavailable",
            "Visibility",
        ),
        "perfgate.envprobe.models",
    ),
    "SCHEMA_VERSION": "perfgate.envprobe.collect",
    "Assembled": "perfgate.envprobe.collect",
    "assemble": "perfgate.envprobe.collect",
    "format_cudnn_version": "perfgate.envprobe.collect",
    "learn_host": "perfgate.envprobe.collect",
    "sanitize_probe_log": "perfgate.envprobe.collect",
    "FINGERPRINT_VERSION": "perfgate.envprobe.fingerprint",
    "compare_fingerprints": "perfgate.envprobe.fingerprint",
    "make_fingerprint": "perfgate.envprobe.fingerprint",
    "ProbeOutput": "perfgate.envprobe.probe",
    "is_server_interpreter": "perfgate.envprobe.probe",
    "parse_probe_output": "perfgate.envprobe.probe",
    "probe_script": "perfgate.envprobe.probe",
    "probe_sha256": "perfgate.envprobe.probe",
    "probe_source": "perfgate.envprobe.probe",
    "GitSnapshot": "perfgate.envprobe.provenance",
    "container_provenance": "perfgate.envprobe.provenance",
    "git_snapshot": "perfgate.envprobe.provenance",
    "collect_system_tools": "perfgate.envprobe.systools",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
