"""A child process's own peak memory, for the bounded-memory tests.

`resource.getrusage(RUSAGE_SELF).ru_maxrss` cannot serve in a child of the test process: Linux carries
the parent's high-water mark across fork and exec, so a child started from pytest (torch imported,
hundreds of MB) reports pytest's peak until it exceeds it, and a growth measured from it reads zero.
`VmHWM` in /proc/self/status belongs to the child's own address space.
"""

# Source text prepended to the code a test runs with `python -c`: defines `peak_kib()`.
PEAK_KIB = """
def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
"""
