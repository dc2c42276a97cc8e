/*
 * LD_PRELOAD shim for Debian's user-mode Linux 6.1 kernel on hosts whose CPUs have large
 * extended register state (AMX: the host kernel's XSAVE area is ~11 KB).
 *
 * UML saves and restores its guest processes' FPU state with ptrace(PTRACE_GETREGSET /
 * PTRACE_SETREGSET, NT_X86_XSTATE) into a buffer of its own fixed size. The host kernel
 * refuses a SETREGSET whose buffer is not exactly its whole XSAVE area (EFAULT), so on such
 * hosts UML panics at the first guest process ("ptrace set fp regs failed, errno = 14").
 *
 * This shim passes every other ptrace call through unchanged. For the XSTATE regset it reads
 * the whole area into a buffer of the host's size; a GET hands UML the part it asked for, a
 * SET lays UML's part over the current whole area and writes that back. Components beyond
 * UML's buffer (AMX tile state, which a guest cannot enable: its syscalls never reach the
 * host) keep the values they have.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <stdarg.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Larger than any XSAVE area x86 defines today (AMX: 11,008 bytes). */
#define WHOLE_AREA_MAX (64 * 1024)

typedef long (*ptrace_fn)(int, pid_t, void *, void *);

long ptrace(enum __ptrace_request request, ...)
{
    static ptrace_fn real_ptrace;
    static __thread char whole[WHOLE_AREA_MAX] __attribute__((aligned(64)));
    va_list ap;
    va_start(ap, request);
    pid_t pid = va_arg(ap, pid_t);
    void *addr = va_arg(ap, void *);
    void *data = va_arg(ap, void *);
    va_end(ap);
    if (!real_ptrace)
        real_ptrace = (ptrace_fn)dlsym(RTLD_NEXT, "ptrace");
    if ((request != PTRACE_GETREGSET && request != PTRACE_SETREGSET)
        || (long)addr != NT_X86_XSTATE)
        return real_ptrace(request, pid, addr, data);

    struct iovec *theirs = data;
    struct iovec area = {whole, sizeof whole};
    long rc = real_ptrace(PTRACE_GETREGSET, pid, addr, &area); /* area.iov_len: host's size */
    if (rc < 0)
        return rc;
    size_t n = theirs->iov_len < area.iov_len ? theirs->iov_len : area.iov_len;
    if (request == PTRACE_GETREGSET) {
        memcpy(theirs->iov_base, whole, n);
        theirs->iov_len = n;
        return 0;
    }
    memcpy(whole, theirs->iov_base, n);
    return real_ptrace(PTRACE_SETREGSET, pid, addr, &area);
}
