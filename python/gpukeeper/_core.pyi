"""Type stub of the compiled module gpukeeper._core (csrc/bindings)."""

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

class GpuError(Exception):
    """Base class of every gpukeeper error."""
class InvalidInputError(GpuError, ValueError):
    """Bad input; nothing was changed. Also a ValueError."""
class AllocationError(GpuError, MemoryError):
    """Memory could not be had after releasing caches and running reclaim callbacks. Also a
    MemoryError.
    """
class DeviceError(GpuError, RuntimeError):
    """A CUDA call failed; the message names the call, the error code's name and its text."""

def build_info() -> Dict[str, Any]:
    """How the core was built: CUDA or CPU-only, CUDA version, compiler."""
def cuda_status() -> Dict[str, Any]:
    """CUDA at run time: available, device count, driver/runtime versions, and why not."""
def cuda_device_count() -> int:
    """Usable CUDA devices (0 without CUDA)."""
def device_memory_info(device: int) -> Tuple[int, int]:
    """(free, total) bytes of a CUDA device (cudaMemGetInfo)."""
def host_memory_info() -> Tuple[int, int]:
    """(available, total) bytes of host memory."""

# The CUDA driver, asked without creating a context (csrc/bindings/device.cpp).
CPU_DEVICE: int  # -1: the device id that means the host (Timer, EventLog)
def cuda_driver_loaded() -> Optional[bool]:
    """Whether libcuda.so.1 is mapped into the process (asking loads nothing); None where this
    cannot be asked. Without it no CUDA context exists.
    """
def driver_device_count() -> Optional[int]:
    """Devices the CUDA driver reports (cuInit + cuDeviceGetCount, no context), or None when
    the driver cannot be reached (CPU-only build, no driver, cuInit failed).
    """
def primary_context_active(device: int) -> Optional[bool]:
    """Whether the primary context of CUDA device `device` exists (cuDevicePrimaryCtxGetState;
    creates none). False when libcuda is not loaded; None when the driver cannot be asked or
    has no such device.
    """
def current_context_foreign() -> Optional[int]:
    """The CUDA ordinal of the context current on this thread when it is not its device's
    primary context (one made with cuCtxCreate, e.g. by OpenMM), else None.
    """
def device_pci_bus_id(device: int) -> Optional[str]:
    """The PCI bus id of CUDA device `device` ('0000:65:00.0', cuDeviceGetPCIBusId), or None
    when unknown.
    """
def driver_device_info(device: int) -> Optional[Dict[str, Any]]:
    """The device as the driver describes it without a context: a dict with the keys it
    answered of multiprocessors, sm_clock_max_mhz, memory_clock_max_mhz,
    memory_bus_width_bits, l2_cache_bytes, cc_major, cc_minor, name, total_memory_bytes,
    uuid ('GPU-...'); None when the driver cannot be reached or has no such device.
    """

class Precision:
    """Element type of a buffer; sizes count these elements."""
    Fp64: "Precision"
    Fp32: "Precision"
    Fp16: "Precision"
    Bf16: "Precision"
    Int64: "Precision"
    Int32: "Precision"
    Int16: "Precision"
    Int8: "Precision"
    Uint8: "Precision"
    Bool: "Precision"
    @property
    def itemsize(self) -> int:
        """Bytes per element."""
    @property
    def label(self) -> str:
        """Short name: 'fp32', 'bf16', ..."""
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    @staticmethod
    def parse(value: Any) -> "Precision":
        """A Precision from a name ('fp32', 'float32', 'half') or a numpy/torch dtype."""

class PoolStats:
    """A snapshot of one pool's books (bytes and counts)."""
    allocated_bytes: int
    allocated_count: int
    requested_bytes: int
    reserved_bytes: int
    segment_count: int
    cached_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    largest_free_block: int
    limit_bytes: int
    cache_hits: int
    cache_misses: int
    upstream_allocations: int
    upstream_frees: int
    oom_events: int
    callback_errors: int
    pages_moved: int
    @property
    def fragmentation(self) -> float:
        """1 - largest free block / cached bytes."""
    def to_dict(self) -> Dict[str, Any]: ...
    def __getitem__(self, key: str) -> Any: ...

class StatCounter:
    """One quantity: current value, peak, and total increase/decrease."""
    current: int
    peak: int
    allocated: int
    freed: int

class StatFamily:
    """A quantity in all and per size class."""
    all: StatCounter
    small: StatCounter
    large: StatCounter

class PoolHistory:
    """What a pool has done, in PyTorch's memory_stats terms."""
    allocated_bytes: StatFamily
    allocations: StatFamily
    requested_bytes: StatFamily
    reserved_bytes: StatFamily
    segments: StatFamily
    inactive_split_bytes: StatFamily
    inactive_splits: StatFamily
    alloc_retries: int
    ooms: int
    limit_rejections: int
    device_allocs: int
    device_frees: int
    device_syncs: int
    def to_dict(self) -> Dict[str, Any]:
        """Every figure as nested dicts: family -> all/large_pool/small_pool ->
        current/peak/allocated/freed, plus the event counts.
        """

class BlockSnapshot:
    """One block of a segment."""
    address: int
    size: int
    requested: int
    allocated: bool

class SegmentSnapshot:
    """One segment with its blocks in address order."""
    address: int
    size: int
    mapped_bytes: int
    stream: int
    small: bool
    expandable: bool
    blocks: List[BlockSnapshot]

class ManagedBuffer:
    """One pool block, returned to its pool by release(), at the end of a `with` block, or when
    the buffer is garbage. Views taken through the buffer protocol or DLPack keep the memory
    alive until they are gone.
    """
    def release(self) -> None:
        """Returns the block to the pool (once no DLPack or buffer-protocol view remains).
        Using the buffer afterwards raises InvalidInputError.
        """
    def __enter__(self) -> "ManagedBuffer":
        """The buffer itself."""
    def __exit__(self, *exc: object) -> bool:
        """Releases the buffer (see release()); exceptions propagate."""
    @property
    def released(self) -> bool:
        """Whether release() ran (the block may wait for views to go)."""
    @property
    def ptr(self) -> int:
        """Address of the first byte."""
    @property
    def nbytes(self) -> int:
        """Size in bytes (size * itemsize)."""
    @property
    def size(self) -> int:
        """Number of elements."""
    def __len__(self) -> int:
        """Number of elements."""
    @property
    def precision(self) -> Precision:
        """Element type (Precision)."""
    @property
    def device(self) -> int:
        """The device_id the buffer was asked for: a CUDA ordinal, or the id given to a
        host pool.
        """
    @property
    def kind(self) -> str:
        """The pool kind it came from: 'device', 'async', 'host' or 'pinned'."""
    @property
    def stream(self) -> int:
        """The stream (cudaStream_t as an int) the block is ordered on."""
    @property
    def exports(self) -> int:
        """Live views (buffer protocol, DLPack) of this buffer."""
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = ...,
        max_version: Optional[Tuple[int, int]] = ...,
        dl_device: Optional[Tuple[int, int]] = ...,
        copy: Optional[bool] = ...,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __array__(self, dtype: Any = ..., *, copy: Optional[bool] = ...) -> Any:
        """A numpy view of host-visible memory (no copy); it keeps the memory alive."""
    def copy_from_host(self, data: Any) -> None:
        """Copies host data (bytes, bytearray, numpy array, anything with the buffer
        protocol) into the start of the buffer.
        """
    def to_bytes(self) -> bytes:
        """The buffer's contents as bytes, after the work queued on its stream."""

class _MemoryPoolBase:
    def __init__(self, kind: str = ..., expandable: Union[bool, str] = ...) -> None: ...
    @property
    def kind(self) -> str: ...
    @property
    def expandable(self) -> Union[bool, str]:
        """The layout asked for: 'auto' (the default: 'hybrid' where the device has virtual
        memory management, else False), True (every request in expandable ranges; also
        asked as 'expandable'), 'hybrid' (requests over 1 MiB only; small ones in fixed
        segments) or False (fixed segments; also asked as 'fixed').
        """
    @property
    def device_count(self) -> int: ...
    def get_managed_buffer(
        self, device_id: int, size: int, precision: Any = ..., stream: Any = ...
    ) -> ManagedBuffer:
        """A buffer of `size` elements of `precision` on `device_id`, returned to the pool
        when released, when its `with` block ends, or when it is garbage.
        """
    def _get_buffer(self, device_id: int, size: int, precision: Any = ..., stream: Any = ...) -> int: ...
    def _return_buffer(self, device_id: int, buffer: int, size: int, precision: Any = ...) -> None: ...
    def memory_pressure(self, device_id: int) -> Optional[float]:
        """Pressure in [0, 1] (reserved/limit with a limit, else the device's used
        fraction), or None for a device id that does not exist.
        """
    def emergency_cleanup(self, device_id: int) -> int:
        """Returns every cached free segment of the device's pool to the driver, and the
        memory of CUDA-graph capture pools whose graph is gone; bytes released.
        """
    def emergency_cleanup_all(self) -> int:
        """emergency_cleanup on every device's pool; bytes released."""
    def capture_pools(self, device_id: int) -> List[Dict[str, Any]]:
        """The pools of CUDA-graph captures on the device: allocations made on a stream
        while it captures (CuPy's Stream.begin_capture, a raw cudaStreamBeginCapture)
        come from a pool of the capture's own, kept from other work until its graph is
        destroyed. One dict each: capture_id, graph_alive and the pool's books.
        """
    def trim(self, device_id: int, keep_bytes: int = ...) -> int:
        """Releases cached segments until at most keep_bytes stay reserved; bytes released."""
    def set_max_pool_size(self, device_id: int, max_bytes: int) -> None:
        """Limits the bytes the device's pool reserves (0: no limit)."""
    def max_pool_size(self, device_id: int) -> int: ...
    def memory_usage(self, device_id: int) -> Optional[Tuple[int, int]]:
        """(allocated, peak allocated) bytes of the device's pool, or None for a device id
        that does not exist.
        """
    def total_memory_usage(self) -> Tuple[int, int]:
        """(allocated, peak allocated) bytes summed over every device's pool."""
    def stats(self, device_id: int) -> Optional[PoolStats]:
        """PoolStats of the device's pool, or None for an unknown id."""
    def reset_peaks(self, device_id: int) -> None: ...
    def history(self, device_id: int) -> Optional[PoolHistory]:
        """PoolHistory of the device's pool (PyTorch's memory_stats terms), or None for an
        unknown id.
        """
    def reset_accumulated(self, device_id: int) -> None:
        """Restarts the totals and event counts of history()."""
    def snapshot(self, device_id: int) -> List[SegmentSnapshot]:
        """The device pool's segments (SegmentSnapshot) with their blocks, in address order."""
    def validate(self, device_id: int) -> str:
        """What is inconsistent in the pool's books; '' when all is well."""
    def owns(self, device_id: int, ptr: int) -> bool: ...
    def add_watermark(self, device_id: int, level: float, callback: Callable[[float], Any]) -> int:
        """Calls callback(pressure) when the pool's pressure rises to level; re-arms below."""
    def remove_watermark(self, device_id: int, callback_id: int) -> bool: ...
    def add_reclaim_callback(self, device_id: int, callback: Callable[[int], Optional[int]]) -> int:
        """Calls callback(bytes_needed) when the device runs out of memory even after the
        pool dropped its cache; it may free memory and return how much (or None).
        """
    def remove_reclaim_callback(self, device_id: int, callback_id: int) -> bool: ...
    def devices(self) -> List[int]:
        """Device ids whose pools exist."""

# ---- timing (csrc/bindings/timing.cpp)

class Timer:
    """An interval timer on a CUDA stream (pooled events), or on the steady clock for device -1
    / without a usable GPU. start() and stop() never wait; elapsed_ms() waits for the stop
    event only.
    """
    def __init__(
        self, device: int = ..., stream: Any = ..., *, hide_launch_latency: bool = ...,
        gate_timeout_ms: float = ...
    ) -> None: ...
    def start(self) -> None:
        """Records the start (restarts a used timer); with hide_launch_latency, closes a
        StreamGate first.
        """
    def stop(self) -> None:
        """Records the stop (and opens the gate)."""
    def elapsed_ms(self) -> float:
        """Milliseconds from start to stop; waits for the stop event (GIL released)."""
    def ready(self) -> bool:
        """Whether elapsed_ms() would return without waiting."""
    def launch_hidden(self) -> bool:
        """Whether the last measurement's gate opened before its timeout (waits for the
        stop event).
        """
    @property
    def hides_launch_latency(self) -> bool: ...
    @property
    def is_gpu(self) -> bool: ...
    @property
    def device(self) -> int:
        """-1 in CPU mode."""
    @property
    def stream(self) -> int: ...

class EventLog:
    """Many intervals on one stream, recorded without host synchronization and resolved later.
    mark(label) ends the lap since the previous mark (the first mark only sets the origin);
    begin(label)/end() make nestable intervals; resolve() -> [(label, ms)] in the order they
    ended.
    """
    def __init__(self, device: int = ..., stream: Any = ...) -> None: ...
    def mark(self, label: str) -> None: ...
    def begin(self, label: str) -> None: ...
    def end(self) -> None: ...
    def resolve(self) -> List[Tuple[str, float]]:
        """[(label, ms)] of the intervals completed since the last resolve; waits for the
        last event (GIL released). The last mark stays the origin of the next lap.
        """
    def ready(self) -> bool: ...
    def clear(self) -> None: ...
    @property
    def pending(self) -> int: ...
    @property
    def open(self) -> int: ...
    @property
    def is_gpu(self) -> bool: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> int: ...
    def __len__(self) -> int: ...

class StreamGate:
    """Holds a CUDA stream: the gate kernel is queued at construction, and work queued after it
    waits on the device until open() (or the timeout). Used as a context manager it opens on
    exit; it also opens when the object goes away.
    """
    def __init__(self, stream: Any = ..., device: int = ..., timeout_ms: float = ...) -> None: ...
    def queue_floor_kernel(self) -> None:
        """Queues the zero-length calibration kernel behind the closed gate: an event
        recorded before it and one after read the launch floor in place (the device's
        own cost of a bracket, on this stream, just before the measured work).
        InvalidInputError once the gate is open.
        """
    def open(self) -> None:
        """Lets the queued work through (idempotent)."""
    @property
    def outcome(self) -> str:
        """'pending' until the gate kernel finished, then 'opened' or 'timed_out'."""
    @property
    def is_open(self) -> bool: ...
    @property
    def device(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def timeout_ms(self) -> float: ...
    def __enter__(self) -> "StreamGate": ...
    def __exit__(self, *exc: Any) -> None: ...

class Event:
    """A timing event from gpukeeper's per-device event pool (given back when the object goes).
    record(stream) never waits; elapsed_ms(end) waits for end (GIL released).
    """
    def __init__(self, device: int = ...) -> None: ...
    def record(self, stream: Any = ...) -> None:
        """Records the event on a stream (int handle, torch or CuPy stream)."""
    def query(self) -> bool:
        """True when the device has passed the last record."""
    def synchronize(self) -> None: ...
    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end`; waits for `end`."""
    @property
    def device(self) -> int: ...
    @property
    def recorded(self) -> bool: ...

def synchronize(device: int = ...) -> None:
    """Waits for all work on a CUDA device (GIL released); DeviceError without one."""
def stream_gates_available() -> bool:
    """Whether StreamGate (and Timer(hide_launch_latency=True)) work here: a CUDA build with
    the gate kernel and a usable device.
    """
def launch_floor_ms(device: int = ..., refresh: bool = ...) -> float:
    """What a gated event pair reads around an empty kernel on this device (ms): the device's
    own cost of a measurement, measured once and cached. DeviceError without gates.
    """
def gate_slot_stats(device: int = ...) -> Dict[str, int]:
    """{'created', 'idle', 'retiring'} gate slots of a device (DeviceError without gates)."""
def event_pool_stats(device: int = ...) -> Dict[str, int]:
    """{'created', 'idle'} events of a device's event pool (GpuError without CUDA)."""
def calibration_kernels_available() -> bool:
    """Whether this build has the calibration kernels (it was built with CUDA)."""
def spin_kernel(duration_ns: int, stream: Any = ..., out: Optional[int] = ...) -> None:
    """Queues a kernel that spins for duration_ns by %globaltimer on stream (current device);
    does not wait. With out (the device address of two uint64), the kernel writes its first
    and last %globaltimer readings there (ns). DeviceError without the kernels.
    """
def calibrate(
    duration_ns: int, stream: Any = ..., device: int = ..., *, hide_launch_latency: bool = ...
) -> Dict[str, Any]:
    """Times one spin kernel with a Timer: {'requested_ns', 'kernel_ns' (from %globaltimer),
    'event_ms', 'launch_hidden'}. Waits (GIL released). DeviceError without kernels or a
    GPU.
    """

# ---- the PyTorch allocator hook (csrc/bindings/torch_allocator.cpp)

def _torch_malloc_symbols() -> Tuple[str, str]:
    """Names of the allocation functions this module exports for PyTorch."""
def _torch_pool_stats(device: int) -> Optional[PoolStats]:
    """PoolStats of the pool behind PyTorch on a device, or None."""
def _torch_pool_cleanup(device: int) -> int:
    """Releases the cached memory of the torch pools, and of graph pools no graph uses (device
    -1: all devices).
    """
def _torch_pool_devices() -> List[int]:
    """Devices on which PyTorch allocated through gpukeeper."""
def _torch_pool_validate(device: int) -> str: ...
def _set_torch_reclaim(callback: Optional[Callable[[int], Optional[int]]]) -> None:
    """Sets the Python callable run (with the bytes needed) when a torch pool is out of memory.
    """
def _link_torch_oom(library_paths: List[str]) -> str:
    """Finds PyTorch's c10::OutOfMemoryError in its loaded libraries at these paths, so that a
    failed allocation raises torch.cuda.OutOfMemoryError. Returns '' or why not.
    """
def _torch_oom_probe(message: str) -> Tuple[str, str]: ...
def _torch_pool_counter(device: int, which: int) -> int:
    """allocated (0), reserved (1), peak allocated (2) or peak reserved (3) bytes of the pools
    behind PyTorch on a device, its CUDA graphs' private pools included (their peaks add up:
    an upper bound); 0 before its first allocation there.
    """
def _torch_pool_history(device: int) -> PoolHistory:
    """PoolHistory of the pool behind PyTorch on a device (empty if none)."""
def _torch_pool_snapshot(device: int) -> List[SegmentSnapshot]:
    """Segments of the pool behind PyTorch on a device."""
def _torch_pool_reset(device: int, peaks: bool, accumulated: bool) -> None:
    """Resets the peaks and/or the totals of the pool behind PyTorch on a device."""
def _torch_pool_set_fraction(device: int, fraction: float) -> None:
    """Limits the pool behind PyTorch on a device to fraction * the device's memory."""
def _torch_pool_fraction(device: int) -> float:
    """The limit of the pool behind PyTorch as a fraction of the device."""
def _torch_pool_set_layout(expandable: Union[bool, str, None]) -> None:
    """Where the pools behind PyTorch keep blocks, as MemoryPool's `expandable`; only before
    the first of them is made (InvalidInputError after).
    """
def _torch_pool_api() -> int:
    """Address of the table of pool functions handed to the PyTorch allocator component
    (torch_ext/pool_api.hpp), and its version.
    """

_torch_pool_api_version: int

def _link_torch_graph_pools(library_paths: List[str]) -> str:
    """Gives PyTorch's pluggable allocator (installed already) gpukeeper's graph-pool
    callbacks, found in its loaded libraries at these paths. Returns '' or why not.
    """
def _torch_graph_pools(device: int) -> List[Dict[str, Any]]:
    """The private graph pools behind PyTorch on a device: id, uses, capturing and books."""
def _set_buffer_hook(hook: Optional[Callable[[ManagedBuffer], None]]) -> None:
    """Calls hook(buffer) with each new ManagedBuffer (None: stop). For leak tracking."""
def _live_buffers() -> List[ManagedBuffer]:
    """Every ManagedBuffer object alive now, released or not (for leak reports)."""
def _orphaned_pools() -> List[Any]:
    """Pools whose MemoryPool is gone but whose blocks are still out (a buffer returned from a
    function that made its own pool).
    """
