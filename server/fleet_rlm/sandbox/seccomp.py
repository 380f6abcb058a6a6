"""The sandbox's seccomp filter: a classic-BPF program that bubblewrap installs (``--seccomp FD``)
right before it starts the worker, so the refusal holds for every process the model's code starts.

Dropped capabilities already make these calls fail; the filter is the second wall, so one missing
bwrap flag (or a kernel that grants a namespace's root more than expected) is not the whole defence.
Refused with EPERM: the mount family (the binds cannot be remounted writable), namespace creation
and entry (no nested user namespace to regain capabilities in), and the kernel-facing calls no
Python code needs (keyrings, eBPF, perf, module and kexec loading, swap, reboot, clocks, hostnames,
file handles). ``clone3`` answers ENOSYS, so libc falls back to ``clone``, whose flags a classic
filter can read (clone3 passes them in memory it cannot); ``clone`` with a namespace flag is refused.
Calls of another ABI than the native one (i386, x32 on x86_64) are refused whole.

Written by hand rather than through libseccomp: 40 instructions, no C library to find at run time."""

from __future__ import annotations

import errno
import platform
import struct
import sys

__all__ = ["REFUSED_SYSCALLS", "filter_program", "supported", "syscall_number"]

# The calls refused, by name; their numbers per architecture below (from the kernel's unistd tables).
REFUSED_SYSCALLS = (
    # the mount family
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr",
    # namespaces
    "unshare", "setns",
    # kernel surfaces no sandboxed Python needs
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "swapon", "swapoff", "reboot",
    "acct", "quotactl", "syslog", "open_by_handle_at", "name_to_handle_at", "sethostname",
    "setdomainname", "settimeofday", "clock_settime",
)  # fmt: skip

_X86_64 = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 272,
    "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179,
    "syslog": 103, "open_by_handle_at": 304, "name_to_handle_at": 303, "sethostname": 170,
    "setdomainname": 171, "settimeofday": 164, "clock_settime": 227, "iopl": 172, "ioperm": 173,
    "clone": 56, "clone3": 435,
}  # fmt: skip
_AARCH64 = {
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "unshare": 97,
    "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
    "userfaultfd": 282, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
    "delete_module": 106, "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89, "quotactl": 60,
    "syslog": 116, "open_by_handle_at": 265, "name_to_handle_at": 264, "sethostname": 161,
    "setdomainname": 162, "settimeofday": 170, "clock_settime": 112, "clone": 220, "clone3": 435,
}  # fmt: skip
# machine -> (AUDIT_ARCH_* value, syscall numbers, extra calls refused there, x32-style ABI bit)
_ARCHES = {
    "x86_64": (0xC000003E, _X86_64, ("iopl", "ioperm"), 0x40000000),
    "aarch64": (0xC00000B7, _AARCH64, (), None),
}
_ARCHES["amd64"] = _ARCHES["x86_64"]
_ARCHES["arm64"] = _ARCHES["aarch64"]

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (low word first here)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def supported(machine: str | None = None) -> bool:
    """Whether a filter exists for this machine's architecture (x86_64 and aarch64 today)."""
    return (machine or platform.machine()) in _ARCHES and sys.byteorder == "little"


def filter_program(machine: str | None = None) -> bytes:
    """The filter as the bytes of a ``sock_filter`` array, what ``bwrap --seccomp FD`` reads."""
    arch, numbers, extra, abi_bit = _ARCHES[machine or platform.machine()]
    refused = sorted({numbers[name] for name in (*REFUSED_SYSCALLS, *extra)})
    # Each instruction is (code, jump if true, jump if false, k); jumps count instructions skipped.
    body: list[tuple[int, int, int, int]] = []
    deny: list[int] = []  # indexes of jumps to patch to the final EPERM
    body.append((_LD_ABS, 0, 0, _ARCH))
    body.append((_JEQ, 1, 0, arch))
    body.append((_RET, 0, 0, _ERRNO | errno.EPERM))  # another ABI (i386 on x86_64): refused whole
    body.append((_LD_ABS, 0, 0, _NR))
    if abi_bit is not None:
        deny.append(len(body))
        body.append((_JGE, 0, 0, abi_bit))  # the x32 ABI of x86_64
    for number in refused:
        deny.append(len(body))
        body.append((_JEQ, 0, 0, number))
    body.append((_JEQ, 0, 1, numbers["clone3"]))
    body.append((_RET, 0, 0, _ERRNO | errno.ENOSYS))
    body.append((_JEQ, 1, 0, numbers["clone"]))
    body.append((_RET, 0, 0, _ALLOW))
    body.append((_LD_ABS, 0, 0, _ARG0_LOW))  # clone's flags
    deny.append(len(body))
    body.append((_JSET, 0, 0, _CLONE_NEW_FLAGS))
    body.append((_RET, 0, 0, _ALLOW))
    end = len(body)
    body.append((_RET, 0, 0, _ERRNO | errno.EPERM))
    for index in deny:
        code, _, jf, k = body[index]
        offset = end - index - 1
        if offset > 255:  # a classic BPF jump is one byte
            raise AssertionError("seccomp filter too long for its jumps")
        body[index] = (code, offset, jf, k)
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in body)


def syscall_number(name: str, machine: str | None = None) -> int:
    """The number of a listed call on this architecture, or -1 where no filter exists."""
    arch = _ARCHES.get(machine or platform.machine())
    return arch[1].get(name, -1) if arch is not None and supported(machine) else -1
