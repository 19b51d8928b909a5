import CShims

#if canImport(Glibc)
import Glibc
#endif

/// Which kernel interface an event backend sleeps in.
public enum EventBackendKind: String, Sendable, Hashable, CaseIterable {
    /// io_uring (liburing): one `io_uring_enter` submits pending polls and
    /// waits with a nanosecond timeout.
    case ioUring = "io_uring"
    /// epoll: `epoll_pwait2` with one-shot descriptor arming.
    case epoll
}

/// Readiness of a file descriptor.
public struct Readiness: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Data can be read (or a peer closed, or a listening socket has a connection).
    public static let readable = Readiness(rawValue: CSHIMS_EVENT_READABLE)
    /// A write would not block.
    public static let writable = Readiness(rawValue: CSHIMS_EVENT_WRITABLE)
    /// Reported, never requested: an error condition on the descriptor.
    public static let error = Readiness(rawValue: CSHIMS_EVENT_ERROR)
    /// Reported, never requested: the peer hung up.
    public static let hangup = Readiness(rawValue: CSHIMS_EVENT_HANGUP)
}

/// What a registration's wait reported: the descriptor became ready, or it
/// can no longer be watched.
package struct ReadyEvent: Sendable, Hashable {
    /// The registration's token (`EventRegistry.register`).
    package var token: UInt64
    /// What the kernel reported, within the registration's interest plus
    /// `.error` and `.hangup`; empty when `failure` is set.
    package var readiness: Readiness
    /// Why the descriptor cannot be watched any more (closed: EBADF; the
    /// kernel refused: ENOMEM, ENOSPC, EPERM). The registration is disarmed
    /// and stays so; its owner should deregister it.
    package var failure: DescriptorWatchError?

    package init(token: UInt64, readiness: Readiness, failure: DescriptorWatchError? = nil) {
        self.token = token
        self.readiness = readiness
        self.failure = failure
    }
}

/// Counters an event registry keeps, for tests and benchmarks.
public struct EventBackendStatistics: Sendable, Hashable {
    /// `wake()` calls.
    public var wakeRequests: UInt64
    /// `wake()` calls that made a system call because the loop was asleep.
    public var wakeSyscalls: UInt64
    /// Times the loop entered the kernel to wait (or poll) for events.
    public var waitSyscalls: UInt64
}

/// The kernel watch an `EventRegistry` holds on one descriptor, as it hands
/// it back to the backend that made it.
package struct KernelWatch: Sendable, Hashable {
    /// The key the watch reports with: the descriptor in the low 32 bits, a
    /// generation in the high ones, so a report from an older watch of the
    /// same descriptor number is told apart.
    var key: UInt64
    /// Whether the watch has not reported yet (one-shot: after its report
    /// the kernel keeps it disabled, epoll, or gone, io_uring).
    var pending: Bool
}

/// One completion a backend read from the kernel.
package struct KernelCompletion: Sendable, Hashable {
    /// The watch's key.
    var key: UInt64
    /// Readiness bits (≥ 0), or -errno for a watch the kernel ended with an
    /// error (io_uring's -EBADF for a descriptor closed under its poll).
    var result: Int32
}

/// The kernel calls of one event interface, and nothing else: which
/// descriptors are registered, for what, and what happens after a report is
/// the `EventRegistry`'s business. A backend watches each descriptor at most
/// once, one-shot, for the union of its registrations' interests.
///
/// `watch`, `unwatch` and `enterKernel` are called only by the registry's
/// owner thread, with the registry's lock held for the first two;
/// `signalWaker()` from any thread.
package protocol EventBackend: AnyObject, Sendable {
    /// Which kernel interface this backend uses.
    var kind: EventBackendKind { get }

    /// Watches `fd` once for `interest`, to report with `key`, replacing
    /// `current` (the registry's last watch of this descriptor, if it has
    /// not removed it). Returns 0 or -errno (EBADF: the descriptor is
    /// closed; ENOMEM, ENOSPC: the kernel refused).
    func watch(_ fd: Int32, for interest: Readiness, key: UInt64, replacing current: KernelWatch?) -> Int32

    /// Removes the watch `current` of `fd`. A descriptor already closed has
    /// lost its watch with it; that is not an error.
    func unwatch(_ fd: Int32, current: KernelWatch)

    /// Whether watches were changed without the kernel having been told yet
    /// (io_uring queues them for the next `enterKernel`).
    var hasUnsubmittedChanges: Bool { get }

    /// Hands queued changes to the kernel and waits at most
    /// `timeoutNanoseconds` (negative: no limit; 0: only collects) for a
    /// watch to report or the waker to fire. Appends the watches' reports to
    /// `completions`, consumes the waker's, and returns 0 and whether the
    /// waker fired, or -errno of the wait itself (-EINTR: a signal arrived;
    /// the registry retries).
    func enterKernel(timeoutNanoseconds: Int64, completions: inout [KernelCompletion]) -> (rc: Int32, woken: Bool)

    /// Makes the waker fire (an eventfd write), waking `enterKernel`. Any
    /// thread; never blocks.
    func signalWaker()
}

/// Backend selection.
public enum EventBackends {
    /// Creates a backend of `kind`, or of the preferred kind: the
    /// `SPINDLE_EVENT_BACKEND` environment variable (`io_uring` or `epoll`)
    /// if set, else io_uring when this process may use it, else epoll.
    /// Throws when the kernel refuses the kind asked for. With no kind asked
    /// for or forced, a ring the kernel refuses now (ENOMEM: the locked-memory
    /// limit; EMFILE) falls back to epoll before anything is thrown.
    package static func makeBackend(_ kind: EventBackendKind? = nil) throws(SystemCallError) -> any EventBackend {
        switch kind ?? preferredKind {
        case .ioUring:
            do {
                return try URingEventBackend()
            } catch {
                guard kind == nil, getenv("SPINDLE_EVENT_BACKEND") == nil else { throw error }
                return try EpollEventBackend()
            }
        case .epoll:
            return try EpollEventBackend()
        }
    }

    /// Why io_uring cannot be used by this process (EPERM under Docker's
    /// default seccomp profile or `kernel.io_uring_disabled`, ENOSYS on old
    /// kernels), or nil when it can. Probed once.
    public static let ioUringRefusal: SystemCallError? = {
        var error: Int32 = 0
        guard let ring = cshims_uring_create(4, 0, &error) else {
            return SystemCallError(call: "io_uring_setup", code: -error)
        }
        defer { cshims_uring_destroy(ring) }
        if cshims_uring_has_ext_arg(ring) == 0 {
            return SystemCallError(call: "io_uring_setup (IORING_FEAT_EXT_ARG missing, kernel < 5.11)", code: ENOSYS)
        }
        return nil
    }()

    /// The kind `makeBackend()` picks: `SPINDLE_EVENT_BACKEND` if set (an unknown
    /// value stops the process with a message), else io_uring unless refused.
    public static var preferredKind: EventBackendKind {
        if let forced = getenv("SPINDLE_EVENT_BACKEND") {
            let name = String(cString: forced)
            guard let kind = EventBackendKind(rawValue: name) else {
                misuse("SPINDLE_EVENT_BACKEND is '\(name)'; use 'io_uring' or 'epoll'")
            }
            return kind
        }
        return ioUringRefusal == nil ? .ioUring : .epoll
    }
}

/// Relative nanoseconds until `deadline` for a kernel wait: -1 for none,
/// 0 for a deadline already past.
func timeoutNanoseconds(until deadline: MonotonicClock.Instant?) -> Int64 {
    guard let deadline, !deadline.isDistantFuture else { return -1 }
    return max(0, deadline.nanoseconds &- MonotonicClock.now.nanoseconds)
}
