import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The epoll backend: an epoll instance, an eventfd for wake-ups, and
/// `epoll_pwait2` for nanosecond timeouts. Chosen when io_uring is refused,
/// or by `SPINDLE_EVENT_BACKEND=epoll`. See `EventBackend`.
public final class EpollEventBackend: EventBackend, @unchecked Sendable {
    // @unchecked: `armed` and the buffers are loop-thread only; `wake()`
    // touches only the atomic wake state and the eventfd.

    public var kind: EventBackendKind { .epoll }
    private let epfd: Int32
    private let wakeFD: Int32
    private let wakeState = LoopWakeState()
    /// Descriptors currently added to the epoll set.
    private var armed: Set<Int32> = []
    private var tokens = [UInt64](repeating: 0, count: 64)
    private var masks = [UInt32](repeating: 0, count: 64)

    static let wakeToken: UInt64 = 0

    /// Creates the epoll instance and its eventfd. Throws when the process
    /// is out of descriptors or memory.
    public init() throws(SystemCallError) {
        let ep = cshims_epoll_create()
        guard ep >= 0 else { throw SystemCallError(call: "epoll_create1", code: -ep) }
        let ev = cshims_eventfd_create()
        guard ev >= 0 else {
            _ = cshims_close(ep)
            throw SystemCallError(call: "eventfd", code: -ev)
        }
        // The waker stays armed: level-triggered, drained on each report.
        let rc = cshims_epoll_add_persistent(ep, ev, Readiness.readable.rawValue, Self.wakeToken)
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

    public func arm(_ fd: Int32, for interest: Readiness, token: UInt64) throws(SystemCallError) {
        require(token != Self.wakeToken && token != .max, "EventBackend.arm: token \(token) is reserved")
        let modify = armed.contains(fd)
        let rc = cshims_epoll_arm(epfd, fd, interest.rawValue, token, modify ? 1 : 0)
        if rc == -EEXIST {
            // Added by a previous arming we lost track of: re-arm instead.
            let again = cshims_epoll_arm(epfd, fd, interest.rawValue, token, 1)
            guard again == 0 else { throw SystemCallError(call: "epoll_ctl", code: -again) }
        } else if rc != 0 {
            throw SystemCallError(call: "epoll_ctl", code: -rc)
        }
        armed.insert(fd)
    }

    public func disarm(_ fd: Int32, token: UInt64) {
        guard armed.remove(fd) != nil else { return }
        // EBADF/ENOENT: the descriptor was closed (which removes it) first.
        _ = cshims_epoll_remove(epfd, fd)
    }

    public func wait(until deadline: MonotonicClock.Instant?, events: inout [ReadyEvent]) -> Bool {
        var timeout = timeoutNanoseconds(until: deadline)
        if timeout != 0 {
            switch wakeState.waitBeforeKernel(until: deadline, descriptorsArmed: !(armed.isEmpty)) {
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
        // A poll (timeout 0) does not announce sleep; a wake meanwhile stays
        // pending for the next wait.
        let sleeping = timeout != 0 && wakeState.enterSleep()
        if timeout != 0 && !sleeping {
            timeout = 0
            woken = true
        }
        wakeState.noteWait()
        var n: Int32
        repeat {
            n = tokens.withUnsafeMutableBufferPointer { t in
                masks.withUnsafeMutableBufferPointer { m in
                    cshims_epoll_wait(epfd, t.baseAddress, m.baseAddress, Int32(t.count), timeout)
                }
            }
        } while n == -EINTR
        if sleeping && wakeState.leaveSleep() { woken = true }
        if n < 0 { misuse("epoll_pwait2 failed: \(errnoDescription(-n))") }
        for i in 0..<Int(n) {
            if tokens[i] == Self.wakeToken {
                _ = cshims_eventfd_drain(wakeFD)
                woken = true
            } else {
                events.append(ReadyEvent(token: tokens[i], readiness: Readiness(rawValue: masks[i])))
            }
        }
        return woken
    }

    public func wake() {
        wakeState.wake(signalling: wakeFD)
    }

    public var statistics: EventBackendStatistics { wakeState.statistics }
}
