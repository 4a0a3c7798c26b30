"""CuPy's stream capture under use_cupy_allocator(): the allocations a capture makes come
from a pool of its own, which other work never gets while the graph lives (every replay
writes to the addresses the capture baked in), and which is freed at the first cleanup
after CUDA destroys the graph."""

import time

import pytest

import gpukeeper

pytestmark = pytest.mark.skipif(not gpukeeper.cuda_available(), reason="needs a CUDA device")
N = 1 << 20


@pytest.fixture
def cupy_hook():
    cupy = pytest.importorskip("cupy")
    from gpukeeper.integrations import restore_cupy_allocator, use_cupy_allocator

    pool = use_cupy_allocator()
    yield cupy, pool
    restore_cupy_allocator()
    pool.emergency_cleanup(0)


def _wait_for_graph_gone(pool, timeout=10.0):
    # CUDA runs the graph's destructor hook on a thread of its own, soon after the graph
    # and its executable are destroyed.
    deadline = time.monotonic() + timeout
    while any(p["graph_alive"] for p in pool.capture_pools(0)) and time.monotonic() < deadline:
        time.sleep(0.001)


def test_replays_keep_their_memory_from_eager_work_on_the_same_stream(cupy_hook):
    cp, pool = cupy_hook
    x = cp.arange(N, dtype=cp.float32)
    (x * 2 + 1).fill(7.0)  # CuPy compiles and loads its kernels outside the capture
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        t = x * 2  # a temporary, freed inside the capture
        y = t + 1
        del t
        g = s.end_capture()
        (capture,) = pool.capture_pools(0)
        assert capture["graph_alive"]
        assert capture["allocated_bytes"] >= 4 * N  # y; t's block is cached there
        assert capture["reserved_bytes"] >= 8 * N
        # Eager arrays on the capture's stream, after it: a capture-blind pool hands them
        # the temporary's block, which every replay overwrites with x * 2.
        eager = [cp.full(N, 7.0, dtype=cp.float32) for _ in range(6)]
    blocks = {a.data.ptr for a in eager}
    assert y.data.ptr not in blocks
    for k in range(3):
        cp.cuda.Device().synchronize()
        x += 1
        cp.cuda.Device().synchronize()
        g.launch(stream=s)
        s.synchronize()
        expected = (cp.arange(N, dtype=cp.float32) + k + 1) * 2 + 1
        assert bool(cp.array_equal(y, expected)), f"replay {k}"
        for a in eager:
            assert bool((a == 7.0).all()), "a replay wrote into an eager array"
    assert pool.validate(0) == ""
    # The graph and its output are gone: the capture's pool goes at the next cleanup.
    del g, y
    _wait_for_graph_gone(pool)
    assert not pool.capture_pools(0)[0]["graph_alive"]
    pool.emergency_cleanup(0)
    assert pool.capture_pools(0) == []
    del eager


def test_a_graph_alive_keeps_its_pool_through_cleanups(cupy_hook):
    cp, pool = cupy_hook
    x = cp.ones(N, dtype=cp.float32)
    cp.sqrt(x * 4)  # kernels compiled and loaded outside the capture
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        y = cp.sqrt(x * 4)
        g = s.end_capture()
    del y  # the graph's output dropped, the graph kept: its replays still write there
    pool.emergency_cleanup(0)
    (capture,) = pool.capture_pools(0)
    assert capture["graph_alive"] and capture["reserved_bytes"] >= 4 * N
    g.launch(stream=s)
    s.synchronize()
    del g
    _wait_for_graph_gone(pool)
    pool.emergency_cleanup(0)
    assert pool.capture_pools(0) == []


def test_two_captures_get_two_pools_and_eager_code_none(cupy_hook):
    cp, pool = cupy_hook
    x = cp.ones(N, dtype=cp.float32)
    x * 2.0  # the kernel compiled and loaded outside the captures
    before = pool.stats(0).allocated_bytes
    graphs, outs = [], []
    for scale in (2.0, 3.0):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            outs.append(x * scale)
            graphs.append(s.end_capture())
    assert len(pool.capture_pools(0)) == 2
    assert pool.stats(0).allocated_bytes == before  # nothing of the captures in the main pool
    for graph in graphs:
        graph.launch()
    cp.cuda.Device().synchronize()
    assert float(outs[0].sum()) == 2.0 * N and float(outs[1].sum()) == 3.0 * N
    del graphs, graph, outs
    _wait_for_graph_gone(pool)
    pool.emergency_cleanup(0)
    assert pool.capture_pools(0) == []
