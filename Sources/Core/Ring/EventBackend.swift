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

/// A descriptor that became ready, with the token it was armed with.
public struct ReadyEvent: Sendable, Hashable {
    /// The token the descriptor was armed with.
    public var token: UInt64
    /// What the kernel reported (may include `.error` and `.hangup`).
    public var readiness: Readiness
}

/// Counters an event backend keeps, for tests and benchmarks.
public struct EventBackendStatistics: Sendable, Hashable {
    /// `wake()` calls.
    public var wakeRequests: UInt64
    /// `wake()` calls that made a system call because the loop was asleep.
    public var wakeSyscalls: UInt64
    /// Times the loop entered the kernel to wait (or poll) for events.
    public var waitSyscalls: UInt64
}

/// The one place a Spindle run loop sleeps on time or descriptors.
///
/// A backend belongs to one loop thread: `arm`, `disarm` and `wait` are
/// called only by that thread. `wake()` may be called from any thread; it
/// makes a system call only when the loop is actually asleep (or about to
/// be), tracked by an atomic sleeping/awake word, so waking a busy loop
/// costs one atomic exchange.
///
/// Descriptors are armed one-shot: after an event is reported the
/// descriptor stays quiet until armed again. That lets a loop hold the
/// events of sources not in its running mode without being woken by them
/// over and over.
public protocol EventBackend: AnyObject, Sendable {
    /// Which kernel interface this backend uses.
    var kind: EventBackendKind { get }

    /// Reports `fd` once, tagged `token`, when it is ready for any of
    /// `interest`. Loop thread only. Arming an armed descriptor replaces the
    /// interest. `token` must not be 0 or `UInt64.max` (reserved).
    func arm(_ fd: Int32, for interest: Readiness, token: UInt64) throws(SystemCallError)

    /// Stops watching `fd` (armed with `token`). Loop thread only.
    func disarm(_ fd: Int32, token: UInt64)

    /// Waits until a descriptor is ready, `wake()` is called, or `deadline`
    /// passes (`nil`: no limit; a past deadline only polls). Appends ready
    /// descriptors to `events` and returns whether a `wake()` was seen.
    /// Blocks the loop thread; retries EINTR. Loop thread only.
    func wait(until deadline: MonotonicClock.Instant?, events: inout [ReadyEvent]) -> Bool

    /// Wakes the loop if it sleeps in `wait`, or makes its next `wait`
    /// return at once. Any thread; never blocks. Release ordering: what the
    /// caller wrote before `wake()` is visible to the loop after its `wait`
    /// returns.
    func wake()

    /// The backend's counters.
    var statistics: EventBackendStatistics { get }
}

/// Backend selection.
public enum EventBackends {
    /// Creates a backend of `kind`, or of the preferred kind: the
    /// `SPINDLE_EVENT_BACKEND` environment variable (`io_uring` or `epoll`)
    /// if set, else io_uring when this process may use it, else epoll.
    /// Throws when the kernel refuses the kind asked for.
    public static func makeBackend(_ kind: EventBackendKind? = nil) throws(SystemCallError) -> any EventBackend {
        switch kind ?? preferredKind {
        case .ioUring: try URingEventBackend()
        case .epoll: try EpollEventBackend()
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

    /// The kind `make()` picks: `SPINDLE_EVENT_BACKEND` if set (an unknown
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

/// The sleeping/awake word and counters both backends share.
///
///     awake           the loop is running handlers; a wake only marks `woken`
///     sleepingInKernel the loop waits in epoll/io_uring: a wake writes the eventfd
///     woken           a wake arrived while awake; the next wait returns at once
///     sleepingOnFutex the loop waits on this word (it watches no descriptors):
///                     a wake is a futex wake, cheaper than any eventfd round trip
final class LoopWakeState: @unchecked Sendable {
    // @unchecked: every field is an atomic word.
    static let awake: UInt32 = 0
    static let sleepingInKernel: UInt32 = 1
    static let woken: UInt32 = 2
    static let sleepingOnFutex: UInt32 = 3

    /// How long a loop polls its wake word before sleeping. A reply that
    /// arrives within it costs no system call on either side. Measured on
    /// 2 cores: 10 µs covers a cross-thread perform round trip when the
    /// other loop is awake; longer only burns CPU.
    static let spinBeforeSleep: Duration = .microseconds(10)

    private let words = UnsafeMutablePointer<UInt64>.allocate(capacity: 4)
    private var state: UnsafeMutablePointer<UInt32> { UnsafeMutableRawPointer(words).assumingMemoryBound(to: UInt32.self) }

    init() { words.initialize(repeating: 0, count: 4) }
    deinit { words.deallocate() }

    /// Counts one kernel wait or poll by the loop.
    func noteWait() {
        AtomicMemory.increment(words + 3, ordering: .relaxed)
    }

    /// How early a timed sleep ends so that the rest, spun, ends on time: an
    /// idle core here takes ~20 µs to come back from a timed sleep, which made
    /// 1 ms timers 25 µs late (like Foundation's). Costs at most this much
    /// CPU per timed wake-up; an untimed sleep spins nothing.
    static let wakeLead: Duration = .microseconds(40)

    /// The deadline to sleep until for a wait that must end at `deadline`.
    static func sleepDeadline(for deadline: MonotonicClock.Instant?) -> MonotonicClock.Instant? {
        guard let deadline, !deadline.isDistantFuture else { return deadline }
        return deadline.advanced(by: .zero - wakeLead)
    }

    /// Spins (bounded by `spinBeforeSleep`, or by `deadline` if it comes
    /// first) while no wake is pending. Returns true when a wake arrived.
    func spinForWake(until deadline: MonotonicClock.Instant?, atMost: Duration = spinBeforeSleep) -> Bool {
        let start = MonotonicClock.now
        var limit = start.advanced(by: atMost)
        if let deadline, deadline < limit { limit = deadline }
        var rounds = 0
        while true {
            if AtomicMemory.load(from: state, ordering: .relaxed) == Self.woken { return true }
            for _ in 0..<16 { spinLoopHint() }
            rounds += 1
            // Read the clock every 8 rounds: it costs about as much as a round.
            if rounds & 7 == 0 && MonotonicClock.now >= limit { return false }
        }
    }

    /// Called by the loop before sleeping in `how` (one of the sleeping
    /// states). False when a wake already arrived: the state is reset to
    /// awake and the loop should not sleep.
    func enterSleep(_ how: UInt32 = sleepingInKernel) -> Bool {
        let r = AtomicMemory.compareExchange(expected: Self.awake, desired: how, at: state, ordering: .acquiringAndReleasing)
        if r.exchanged { return true }
        AtomicMemory.store(Self.awake, to: state, ordering: .sequentiallyConsistent)
        return false
    }

    /// Called by the loop after the kernel returned. Acquiring: pairs with
    /// the waker's releasing exchange. Returns whether a wake arrived.
    @discardableResult
    func leaveSleep() -> Bool {
        AtomicMemory.exchange(Self.awake, at: state, ordering: .acquiringAndReleasing) == Self.woken
    }

    /// Sleeps on the wake word itself until a wake or `deadline`; for a loop
    /// that watches no descriptors. Returns whether a wake arrived.
    func sleepOnFutex(until deadline: MonotonicClock.Instant?) -> Bool {
        guard enterSleep(Self.sleepingOnFutex) else { return true }
        noteWait()
        let futex = Futex(state)
        while AtomicMemory.load(from: state, ordering: .acquiring) == Self.sleepingOnFutex {
            if futex.wait(expecting: Self.sleepingOnFutex, until: deadline) == .timedOut { break }
        }
        return leaveSleep()
    }

    /// Called by a waker. Returns true when the caller must signal the
    /// kernel wait (write the eventfd); a futex sleeper is woken here.
    func requestWake() -> Bool {
        AtomicMemory.increment(words + 1, ordering: .relaxed)
        let old = AtomicMemory.exchange(Self.woken, at: state, ordering: .acquiringAndReleasing)
        switch old {
        case Self.sleepingInKernel:
            AtomicMemory.increment(words + 2, ordering: .relaxed)
            return true
        case Self.sleepingOnFutex:
            AtomicMemory.increment(words + 2, ordering: .relaxed)
            Futex(state).wake(1)
            return false
        default:
            return false
        }
    }

    /// How the part of a wait before any kernel call ended.
    enum Prelude {
        /// A wake arrived: the wait returns it (after polling descriptors).
        case woken
        /// The deadline passed while sleeping on the wake word: the wait
        /// only polls the kernel for ready descriptors.
        case timedOut
        /// Descriptors are armed: the wait sleeps in the kernel.
        case sleepInKernel
    }

    /// The part of every backend's wait that needs no kernel wait: a short
    /// spin for a wake already on its way; then, if no descriptor is armed
    /// (`descriptorsArmed` false), a sleep on the wake word that ends
    /// `wakeLead` before `deadline`, and a spin for the rest. Call only with
    /// a wait that may block (a non-zero timeout).
    func waitBeforeKernel(until deadline: MonotonicClock.Instant?, descriptorsArmed: Bool) -> Prelude {
        if spinForWake(until: deadline) {
            leaveSleep()
            return .woken
        }
        guard !descriptorsArmed else { return .sleepInKernel }
        if sleepOnFutex(until: Self.sleepDeadline(for: deadline)) { return .woken }
        if let deadline, spinForWake(until: deadline, atMost: Self.wakeLead * 2) {
            leaveSleep()
            return .woken
        }
        return .timedOut
    }

    /// A waker's side for a backend whose kernel waits watch `eventFD`:
    /// signals it only when the loop sleeps in the kernel. Any thread.
    func wake(signalling eventFD: Int32) {
        guard requestWake() else { return }
        let rc = cshims_eventfd_signal(eventFD)
        if rc < 0 && rc != -EAGAIN { misuse("eventfd write failed: \(errnoDescription(-rc))") }
    }

    var statistics: EventBackendStatistics {
        EventBackendStatistics(
            wakeRequests: AtomicMemory.load(from: words + 1),
            wakeSyscalls: AtomicMemory.load(from: words + 2),
            waitSyscalls: AtomicMemory.load(from: words + 3))
    }
}

/// Relative nanoseconds until `deadline` for a kernel wait: -1 for none,
/// 0 for a deadline already past.
func timeoutNanoseconds(until deadline: MonotonicClock.Instant?) -> Int64 {
    guard let deadline, !deadline.isDistantFuture else { return -1 }
    return max(0, deadline.nanoseconds &- MonotonicClock.now.nanoseconds)
}
