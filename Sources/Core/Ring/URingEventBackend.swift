import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The io_uring backend: one ring per loop. Wake-ups come through an eventfd
/// under a multishot poll (armed once; each write posts a completion, no
/// read needed); descriptors are one-shot polls queued by `arm` and
/// submitted together with the next wait, so arming costs no system call of
/// its own; a wait is one `io_uring_enter` with a nanosecond timeout
/// (IORING_FEAT_EXT_ARG). See `EventBackend`.
public final class URingEventBackend: EventBackend, @unchecked Sendable {
    // @unchecked: the ring and `armed` are loop-thread only; `wake()` touches
    // only the atomic wake state and the eventfd.

    public var kind: EventBackendKind { .ioUring }
    private let ring: OpaquePointer
    private let wakeFD: Int32
    private let wakeState = LoopWakeState()
    /// Armed descriptors: fd → token of its pending poll, and back.
    private var armed: [Int32: UInt64] = [:]
    private var armedByToken: [UInt64: Int32] = [:]
    /// Entries queued since the last submission (removals in particular).
    private var hasQueuedSubmissions = false

    static let wakeToken: UInt64 = 0
    static let removalToken: UInt64 = .max

    /// Sets up a ring of 256 entries. Throws `SystemCallError` with EPERM
    /// when a seccomp profile or `kernel.io_uring_disabled` refuses io_uring,
    /// ENOSYS on a kernel without it (or without EXT_ARG, before 5.11).
    public init() throws(SystemCallError) {
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
        armWaker()
    }

    deinit {
        cshims_uring_destroy(ring)
        _ = cshims_close(wakeFD)
    }

    private func armWaker() {
        let rc = cshims_uring_queue_poll(ring, wakeFD, UInt32(POLLIN), Self.wakeToken, 1)
        if rc != 0 { misuse("io_uring: cannot queue the waker's poll: \(errnoDescription(-rc))") }
    }

    public func arm(_ fd: Int32, for interest: Readiness, token: UInt64) throws(SystemCallError) {
        require(token != Self.wakeToken && token != Self.removalToken, "EventBackend.arm: token \(token) is reserved")
        if let old = armed[fd] {
            _ = cshims_uring_queue_poll_remove(ring, old, Self.removalToken)
            armedByToken[old] = nil
            hasQueuedSubmissions = true
        }
        let rc = cshims_uring_queue_poll(ring, fd, interest.rawValue, token, 0)
        guard rc == 0 else { throw SystemCallError(call: "io_uring (poll)", code: -rc) }
        hasQueuedSubmissions = true
        armed[fd] = token
        armedByToken[token] = fd
    }

    public func disarm(_ fd: Int32, token: UInt64) {
        guard let pending = armed.removeValue(forKey: fd) else { return }
        armedByToken[pending] = nil
        _ = cshims_uring_queue_poll_remove(ring, pending, Self.removalToken)
        hasQueuedSubmissions = true
    }

    public func wait(until deadline: MonotonicClock.Instant?, events: inout [ReadyEvent]) -> Bool {
        var timeout = timeoutNanoseconds(until: deadline)
        if timeout != 0 {
            switch wakeState.waitBeforeKernel(until: deadline, descriptorsArmed: !(armed.isEmpty && !hasQueuedSubmissions)) {
            case .woken:
                // Do not delay descriptors that are ready too.
                if !armed.isEmpty { _ = wait(until: MonotonicClock.Instant(nanoseconds: 0), events: &events) }
                return true
            case .timedOut:
                timeout = 0  // still collect anything ready below
            case .sleepInKernel:
                break
            }
        }
        var woken = false
        let sleeping = timeout != 0 && wakeState.enterSleep()
        if timeout != 0 && !sleeping {
            timeout = 0
            woken = true
        }
        wakeState.noteWait()
        var rc: Int32
        repeat {
            rc = cshims_uring_submit_and_wait(ring, timeout)
        } while rc == -EINTR
        hasQueuedSubmissions = false
        if sleeping && wakeState.leaveSleep() { woken = true }
        if rc != 0 && rc != -ETIME && rc != -EBUSY {
            misuse("io_uring_enter failed: \(errnoDescription(-rc))")
        }
        var token: UInt64 = 0
        var result: Int32 = 0
        var more: Int32 = 0
        while cshims_uring_next_completion(ring, &token, &result, &more) == 1 {
            switch token {
            case Self.wakeToken:
                woken = true
                if more == 0 { armWaker() }  // the kernel ended the multishot poll
            case Self.removalToken:
                continue
            default:
                // A one-shot poll completed: ready (res = mask), or cancelled
                // by a removal / re-arm (-ECANCELED, -ENOENT): drop those.
                guard result >= 0, let fd = armedByToken.removeValue(forKey: token) else { continue }
                armed[fd] = nil
                events.append(ReadyEvent(token: token, readiness: Readiness(rawValue: UInt32(result))))
            }
        }
        return woken
    }

    public func wake() {
        wakeState.wake(signalling: wakeFD)
    }

    public var statistics: EventBackendStatistics { wakeState.statistics }
}
