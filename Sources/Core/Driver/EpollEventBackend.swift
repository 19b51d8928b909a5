import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The epoll backend: an epoll instance, an eventfd for wake-ups, and
/// `epoll_pwait2` for nanosecond timeouts. Chosen when io_uring is refused,
/// or by `SPINDLE_EVENT_BACKEND=epoll`. See `EventBackend`.
///
/// A watch is an `EPOLLONESHOT` entry whose data is the watch's key. After it
/// reports, the kernel keeps the entry, disabled, until it is modified or
/// deleted, or until the descriptor's file is closed, which deletes it
/// silently. So the registry's record can be stale in both directions: a
/// descriptor number it believes watched may have been closed and reused
/// (modify finds nothing: ENOENT, add instead), and one it believes free may
/// still be in the set (add finds it: EEXIST, modify instead).
package final class EpollEventBackend: EventBackend, @unchecked Sendable {
    // @unchecked: the buffers are touched only by the registry's owner
    // thread in `enterKernel`; `signalWaker()` only writes the eventfd.

    package var kind: EventBackendKind { .epoll }
    private let epfd: Int32
    private let wakeFD: Int32
    private var keys = [UInt64](repeating: 0, count: 64)
    private var masks = [UInt32](repeating: 0, count: 64)

    /// The waker's key: no watch has it (a watch's generation is never 0).
    static let wakeKey: UInt64 = 0

    /// Creates the epoll instance and its eventfd. Throws when the process
    /// is out of descriptors or memory.
    package init() throws(SystemCallError) {
        let ep = cshims_epoll_create()
        guard ep >= 0 else { throw SystemCallError(call: "epoll_create1", code: -ep) }
        let ev = cshims_eventfd_create()
        guard ev >= 0 else {
            _ = cshims_close(ep)
            throw SystemCallError(call: "eventfd", code: -ev)
        }
        // The waker stays armed: level-triggered, drained on each report.
        let rc = cshims_epoll_add_persistent(ep, ev, Readiness.readable.rawValue, Self.wakeKey)
        guard rc == 0 else {
            _ = cshims_close(ep)
            _ = cshims_close(ev)
            throw SystemCallError(call: "epoll_ctl", code: -rc)
        }
        epfd = ep
        wakeFD = ev
    }

    deinit {
        _ = cshims_close(wakeFD)
        _ = cshims_close(epfd)
    }

    package func watch(_ fd: Int32, for interest: Readiness, key: UInt64, replacing current: KernelWatch?) -> Int32 {
        let modify: Int32 = current == nil ? 0 : 1
        var rc = cshims_epoll_arm(epfd, fd, interest.rawValue, key, modify)
        if rc == -ENOENT && modify == 1 {
            // Closed (which dropped the entry) and the number reused.
            rc = cshims_epoll_arm(epfd, fd, interest.rawValue, key, 0)
        } else if rc == -EEXIST && modify == 0 {
            // An entry the registry had let go of is still in the set: the
            // same file under another registration's old watch.
            rc = cshims_epoll_arm(epfd, fd, interest.rawValue, key, 1)
        }
        return rc
    }

    package func unwatch(_ fd: Int32, current: KernelWatch) {
        // ENOENT/EBADF: the descriptor was closed first, which removed it.
        _ = cshims_epoll_remove(epfd, fd)
    }

    package var hasUnsubmittedChanges: Bool { false }

    package func enterKernel(timeoutNanoseconds: Int64, completions: inout [KernelCompletion]) -> (rc: Int32, woken: Bool) {
        let n = keys.withUnsafeMutableBufferPointer { k in
            masks.withUnsafeMutableBufferPointer { m in
                cshims_epoll_wait(epfd, k.baseAddress, m.baseAddress, Int32(k.count), timeoutNanoseconds)
            }
        }
        guard n >= 0 else { return (n, false) }
        var woken = false
        for i in 0..<Int(n) {
            if keys[i] == Self.wakeKey {
                _ = cshims_eventfd_drain(wakeFD)
                woken = true
            } else {
                completions.append(KernelCompletion(key: keys[i], result: Int32(bitPattern: masks[i])))
            }
        }
        return (0, woken)
    }

    package func signalWaker() {
        let rc = cshims_eventfd_signal(wakeFD)
        if rc < 0 && rc != -EAGAIN { misuse("eventfd write failed: \(errnoDescription(-rc))") }
    }
}
