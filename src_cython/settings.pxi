# Every SHMCOMM_* tuning setting of the compiled core, read in one place when a group is created.
# (Job identity, RANK/WORLD_SIZE and SHMCOMM_TIMEOUT belong to shmcomm.group.)


cdef inline size_t _align_up(size_t x, size_t a) noexcept nogil:
    return (x + a - 1) // a * a


def _env_bytes(str var, size_t default, size_t minimum):
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{var} must be an integer, got {raw!r}") from None
    if value < <long long>minimum:
        raise ValueError(f"{var} must be at least {minimum}, got {value}")
    return value


_llc_bytes = None


def _last_level_cache_bytes():
    """Size of the largest cache cpu0 sees (sysfs, read once; glibc's sysconf reports the whole
    package's on some VMs, 10x too much); 32 MiB when unknown."""
    global _llc_bytes
    if _llc_bytes is not None:
        return _llc_bytes
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        try:
            with open(f"{base}/{name}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        # (no negative indices: this module is compiled with wraparound=False)
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[len(text) - 1:], 1)
        digits = text[:len(text) - 1] if scale != 1 else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    _llc_bytes = best or 32 << 20
    return _llc_bytes


def group_settings(int size, int threads_per_rank=1):
    """The tuning of a group of ``size`` ranks: each SHMCOMM_* variable, else its default.

    ``threads_per_rank``: the threads each rank keeps busy while its peers wait for it (2 or
    more where every rank also drives another engine, as a node group of a multi-node job does
    with gloo's transport and work threads); waiting spins only when all of them fit the cores.

    Example::

        >>> group_settings(2)["slot_bytes"] >= 4096
        True
    """
    choose_simd_level()
    usable = len(os.sched_getaffinity(0))
    fits = size * max(1, threads_per_rank) <= usable
    return {
        # Messages up to this size go one-shot through the slots.
        "small_bytes": _env_bytes("SHMCOMM_SMALL_BYTES", 16384, 0),
        # Outputs from half the last-level cache up are written with streaming stores; smaller
        # ones stay cached where the caller reads them next (on a 32 MiB-L3 VM, all_gather: 8 MiB
        # streamed 0.6-2.3 ms vs 0.7-0.8 ms, 32 MiB 3.8-4.3 ms vs 4.7-5.2 ms). Reductions, whose
        # outputs are their inputs and still cached, never stream.
        "stream_bytes": _env_bytes("SHMCOMM_STREAM_BYTES", _last_level_cache_bytes() // 2, 0),
        # Ranks that fit the cores spin up to 2 ms before sleeping: a futex wake-up costs tens of
        # microseconds, and far more when another process holds the core. A rank blocked for
        # seconds still sleeps almost all the time. More ranks than cores: never spin.
        "spin_us": _env_bytes("SHMCOMM_SPIN_US", 2000 if fits else 0, 0),
        # More ranks than cores: the peer we wait for needs our core, so give it away with
        # sched_yield for a while (a few hundred microseconds) before sleeping on the futex.
        "yields": _env_bytes("SHMCOMM_YIELDS", 16 if fits else 256, 0),
        "slot_bytes": _env_bytes("SHMCOMM_SLOT_BYTES", 1 << 20, 4096),
        "ring_bytes": _env_bytes("SHMCOMM_RING_BYTES", 256 << 10, 4096),
        # Pieces from this size use cross-memory attach (single copy); 0 turns it off.
        "cma_bytes": _env_bytes("SHMCOMM_CMA_BYTES", 256 << 10, 0),
        # How often the progress thread looks for queued async ops while the group is busy.
        "progress_us": _env_bytes("SHMCOMM_PROGRESS_US", 50, 1),
    }
