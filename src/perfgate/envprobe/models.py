"""The typed pieces of an environment record, shared by the collector and the collect_env tool."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
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
]

Backend = Literal["cuda", "musa", "rocm", "xpu", "cpu"]


class Unavailable(BaseModel):
    """Something that could not be observed, and why (nothing is guessed in its place)."""

    item: str = Field(description="Dotted name of the missing fact, e.g. 'cudnn.version' or 'git'.")
    reason: str


class Device(BaseModel):
    """An accelerator as the training process sees it (indices are after visibility masking)."""

    index: int
    name: str | None
    total_memory_bytes: int | None
    capability: str | None = Field(description="Compute capability 'major.minor' as the runtime reports it.")
    multi_processor_count: int | None = None


class SystemDevice(BaseModel):
    """A device as a system tool (nvidia-smi, NVML, mthreads-gmi, rocm-smi) lists it: all of the host's."""

    index: int | None
    name: str | None
    uuid: str | None = None
    total_memory_bytes: int | None = None
    capability: str | None = None
    pci_bus_id: str | None = None


class SystemTool(BaseModel):
    """One system tool: found on PATH or not, its version, and what parsing its output yielded."""

    name: str
    found: bool
    path: str | None = None
    version: str | None = Field(default=None, description="The tool's own version, when it states one.")
    driver_version: str | None = None
    runtime_version: str | None = Field(
        default=None,
        description="Driver-side runtime version the tool reports (e.g. nvidia-smi's CUDA Version).",
    )
    devices: list[SystemDevice] | None = Field(
        default=None, description="Devices the tool lists; None when this tool does not list devices."
    )
    artifact: str | None = Field(default=None, description="Artifact holding the raw (redacted) output.")
    errors: list[str] = Field(default_factory=list[str])


class RdmaPort(BaseModel):
    """One port of an RDMA device as sysfs lists it (/sys/class/infiniband/<device>/ports/<port>/)."""

    device: str = Field(description="e.g. 'mlx5_0'.")
    port: int
    state: str | None = Field(description="As the kernel states it, e.g. '4: ACTIVE' or '1: DOWN'.")
    rate: str | None = Field(description="e.g. '400 Gb/sec (4X NDR)'.")
    link_layer: str | None = Field(description="'InfiniBand', or 'Ethernet' for RoCE.")


class Topology(BaseModel):
    """Interconnect facts the MoE token exchange (DeepEP, HybridEP) depends on, each feature-detected:
    null means not observed (the reason is in ``unavailable``), an empty list means looked and none found."""

    gpu_links: dict[str, int] | None = Field(
        description="GPU pairs per connection type in `nvidia-smi topo -m` (NV#: # bonded NVLinks; PIX, PXB, "
        "PHB, NODE, SYS: PCIe paths), over the host's GPUs."
    )
    nvlink_active_links: int | None = Field(
        description="NVLinks `nvidia-smi nvlink --status` shows up (with a speed), over the host's GPUs."
    )
    nvlink_inactive_links: int | None
    rdma_ports: list[RdmaPort] | None = Field(description="RDMA ports under /sys/class/infiniband.")
    peer_memory_module: str | None = Field(
        description="The loaded GPUDirect RDMA kernel module (nvidia_peermem or nv_peer_mem); null: neither."
    )
    hybrid_ep: bool | None = Field(
        description="The installed deep_ep distribution ships HybridEP (its file list holds hybrid_ep "
        "files); null: deep_ep is not installed or lists no files."
    )
    notes: list[str] = Field(
        description="Where these facts limit DeepEP/HybridEP (only when deep_ep is installed)."
    )


class Visibility(BaseModel):
    """Devices the process sees next to the variables meant to control that."""

    env: dict[str, str | None] = Field(
        description="Visibility variables as the process saw them (unset: null)."
    )
    governing_variable: str | None = Field(
        description="The variable that restricts devices for this backend."
    )
    listed_count: int | None = Field(
        description="How many devices the governing variable lists; null when unset or not countable."
    )
    process_device_count: int
    system_device_count: int | None = Field(description="Devices the system tools list for the whole host.")
    mismatch: bool = Field(description="What the process sees disagrees with the variables or the host.")
    notes: list[str]


class GitProvenance(BaseModel):
    """The source tree the run starts from."""

    commit: str | None
    branch: str | None
    dirty: bool = Field(
        description="Tracked changes against HEAD, untracked files outside .perfgate/, or files Python can "
        "import that no commit holds (ignored ones included)."
    )
    changed_files: int
    untracked_files: int = Field(
        description="Files neither tracked nor ignored, plus importable files git ignores."
    )
    diff_sha256: str | None = Field(
        description="sha256 of the diff against HEAD, read without running git (git's layout; importable "
        "files no commit holds appear as new files)."
    )
    diff_bytes: int
    diff_artifact: str | None = Field(description="Artifact with the diff (secrets redacted).")
    diff_artifact_redacted: bool = Field(
        description="The artifact differs from the hashed diff by redactions."
    )


class ContainerProvenance(BaseModel):
    """What can be learned about a container from inside it."""

    in_container: bool
    runtime: str | None = Field(description="docker, podman, containerd, cri-o, kubernetes, apptainer, ...")
    container_id: str | None
    image: str | None = Field(
        description="Image reference when an environment variable or runtime file names it."
    )
    image_digest: str | None = Field(description="sha256:... digest when discoverable; never inferred.")
    sources: list[str] = Field(description="Where each fact came from.")


class Provenance(BaseModel):
    git: GitProvenance | None
    container: ContainerProvenance
    launch_command: list[str] | None = Field(description="The training launch command as given (redacted).")


class Fingerprint(BaseModel):
    """The facts that decide whether two measurements are comparable, and their digest.

    Two benchmark windows are comparable only when their environments' fingerprints are equal;
    `perfgate.envprobe.fingerprint.compare_fingerprints` names the fields that differ.
    """

    version: int
    sha256: str
    fields: dict[str, str | int | list[str] | None]


class FingerprintDifference(BaseModel):
    field: str
    baseline: str | int | list[str] | None
    candidate: str | int | list[str] | None


class EnvironmentSummary(BaseModel):
    """The facts an agent needs at a glance; the artifact environment.json holds everything."""

    python_version: str | None
    python_executable: str | None
    in_virtualenv: bool | None
    os: str | None = Field(description="System, kernel release, machine and distribution.")
    cpu_model: str | None
    cpu_count: int | None = Field(
        description="CPUs the process may run on (affinity), else the logical count."
    )
    memory_total_bytes: int | None
    backend: Backend | None = Field(
        description="Accelerator backend detected inside the process; null if unknown."
    )
    backend_reason: str | None
    devices: list[Device]
    torch_version: str | None
    runtime_version: str | None = Field(description="CUDA / HIP / MUSA runtime torch was built with.")
    sdk_version: str | None = Field(
        default=None,
        description="Installed MUSA SDK (toolkit) version from $MUSA_HOME/version.json (default "
        "/usr/local/musa), reported apart from runtime_version (the one torch_musa was built with).",
    )
    driver_version: str | None = Field(
        description="Kernel driver version reported by the backend's system tool."
    )
    driver_source: str | None
    libraries: dict[str, str | None] = Field(
        description="cudnn, nccl, mudnn, mccl (or miopen/rccl) versions; on MUSA also mublas (and musart) from "
        "the SDK's library file names, when found."
    )
    bf16_supported: bool | None
    tf32: dict[str, bool | str | None] = Field(description="TF32 switches and float32 matmul precision.")
    attention: dict[str, bool | None] | None = Field(
        description="SDPA backends enabled/available as torch reports them; null where no API tells."
    )
    packages: dict[str, str] = Field(
        description="Installed versions of the tracked packages (absent: not installed)."
    )
