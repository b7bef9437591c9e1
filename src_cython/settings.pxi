# The compiled core's group tuning, read when a group is created through the one table of every
# SHMCOMM_* variable (shmcomm/settings.py: names, defaults, floors and why).


cdef inline size_t _align_up(size_t x, size_t a) noexcept nogil:
    return (x + a - 1) // a * a


cdef inline bint _spans_overlap(const char *a, size_t na, const char *b, size_t nb) noexcept nogil:
    """Whether two byte spans share a byte (an empty one shares none)."""
    return na != 0 and nb != 0 and a < b + nb and b < a + na


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


cdef int busy_rank_count(int size, object busy_ranks):
    """Ranks of the job that busy-wait here: a group's own, or its parent's where more."""
    return size if busy_ranks is None else max(size, <int>busy_ranks)


def group_settings(int size, int threads_per_rank=1, busy_ranks=None):
    """The tuning of a group of ``size`` ranks: each SHMCOMM_* variable, else its default.

    ``threads_per_rank``: the threads each rank keeps busy while its peers wait for it (2 or
    more where every rank also drives another engine, as a node group of a multi-node job does
    with gloo's transport and work threads); waiting spins only when all of them fit the cores.
    ``busy_ranks``: the ranks of the job running here, when more than this group's (a group made
    through another, ``Communicator.derive``: its parent's): they count for that fit.

    Example::

        >>> group_settings(2)["slot_bytes"] >= 4096
        True
    """
    from shmcomm.settings import GROUP_TUNING, read_int
    choose_simd_level()
    usable = len(os.sched_getaffinity(0))
    facts = {"size": size, "fits": busy_rank_count(size, busy_ranks) * max(1, threads_per_rank) <= usable,
             "llc": _last_level_cache_bytes()}
    return {s.key: read_int(s, s.compute(facts)) for s in GROUP_TUNING}
