"""This process's memory as the kernel counts it (/proc/self/smaps and
smaps_rollup), shared by the tests of what the loaders keep resident."""


def file_rss_kb(path):
    """Resident kB of this process's mappings of `path` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
                inside = len(head) >= 6 and head[5] == str(path)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def rollup_kb(field):
    """`field` of this process's /proc/self/smaps_rollup ("AnonHugePages", "Anonymous"), in kB."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0
