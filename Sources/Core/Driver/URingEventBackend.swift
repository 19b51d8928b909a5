import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The io_uring backend: one ring per registry. Wake-ups come through an
/// eventfd under a multishot poll (armed once; each write posts a
/// completion, no read needed); a watch is a one-shot poll whose user data
/// is the watch's key, queued by `watch` and submitted together with the
/// next wait, so watching costs no system call of its own; a wait is one
/// `io_uring_enter` with a nanosecond timeout (IORING_FEAT_EXT_ARG). See
/// `EventBackend`.
///
/// A poll holds a reference to its descriptor's file, so a poll outstanding
/// on a descriptor the caller closed keeps the file open until it is
/// removed: the registry submits removals before it sleeps (see
/// `hasUnsubmittedChanges`).
package final class URingEventBackend: EventBackend, @unchecked Sendable {
    // @unchecked: the ring is touched only by the registry's owner thread;
    // `signalWaker()` only writes the eventfd.

    package var kind: EventBackendKind { .ioUring }
    private let ring: OpaquePointer
    private let wakeFD: Int32

    /// The waker's poll: no watch has this key (a watch's generation is never 0).
    static let wakeKey: UInt64 = 0
    /// The user data of poll removals, whose completions say nothing.
    static let removalKey: UInt64 = .max

    /// Sets up a ring of 256 entries. Throws `SystemCallError` with EPERM
    /// when a seccomp profile or `kernel.io_uring_disabled` refuses io_uring,
    /// ENOSYS on a kernel without it (or without EXT_ARG, before 5.11).
    package init() throws(SystemCallError) {
        var error: Int32 = 0
        guard let ring = cshims_uring_create(256, 0, &error) else {
            throw SystemCallError(call: "io_uring_setup", code: -error)
        }
        guard cshims_uring_has_ext_arg(ring) != 0 else {
            cshims_uring_destroy(ring)
            throw SystemCallError(call: "io_uring_setup (no IORING_FEAT_EXT_ARG)", code: ENOSYS)
        }
        let ev = cshims_eventfd_create()
        guard ev >= 0 else {
            cshims_uring_destroy(ring)
            throw SystemCallError(call: "eventfd", code: -ev)
        }
        self.ring = ring
        self.wakeFD = ev
        let rc = armWaker()
        guard rc == 0 else {
            cshims_uring_destroy(ring)
            _ = cshims_close(ev)
            throw SystemCallError(call: "io_uring (waker poll)", code: -rc)
        }
    }

    deinit {
        cshims_uring_destroy(ring)
        _ = cshims_close(wakeFD)
    }

    private func armWaker() -> Int32 {
        cshims_uring_queue_poll(ring, wakeFD, UInt32(POLLIN), Self.wakeKey, 1)
    }

    package func watch(_ fd: Int32, for interest: Readiness, key: UInt64, replacing current: KernelWatch?) -> Int32 {
        if let current, current.pending {
            // Its completion (-ECANCELED, under the old key) is dropped as stale.
            let rc = cshims_uring_queue_poll_remove(ring, current.key, Self.removalKey)
            if rc != 0 { return rc }
        }
        return cshims_uring_queue_poll(ring, fd, interest.rawValue, key, 0)
    }

    package func unwatch(_ fd: Int32, current: KernelWatch) {
        guard current.pending else { return }  // a one-shot poll that reported is gone
        let rc = cshims_uring_queue_poll_remove(ring, current.key, Self.removalKey)
        // EBUSY: the queue is full even after a submission; the poll stays
        // until it reports, and its report is dropped as stale.
        _ = rc
    }

    package var hasUnsubmittedChanges: Bool { cshims_uring_has_unsubmitted(ring) != 0 }

    package func enterKernel(timeoutNanoseconds: Int64, completions: inout [KernelCompletion]) -> (rc: Int32, woken: Bool) {
        let rc = cshims_uring_submit_and_wait(ring, timeoutNanoseconds)
        var woken = false
        var key: UInt64 = 0
        var result: Int32 = 0
        var more: Int32 = 0
        // Collect even after a failed wait: completions may be ready.
        while cshims_uring_next_completion(ring, &key, &result, &more) == 1 {
            switch key {
            case Self.wakeKey:
                woken = true
                if more == 0 {
                    // The kernel ended the multishot poll (e.g. CQ overflow): re-arm it.
                    let again = armWaker()
                    if again != 0 { misuse("io_uring: cannot re-arm the waker's poll: \(errnoDescription(-again))") }
                }
            case Self.removalKey:
                continue
            default:
                completions.append(KernelCompletion(key: key, result: result))
            }
        }
        return (rc == -ETIME ? 0 : rc, woken)
    }

    package func signalWaker() {
        let rc = cshims_eventfd_signal(wakeFD)
        if rc < 0 && rc != -EAGAIN { misuse("eventfd write failed: \(errnoDescription(-rc))") }
    }
}
