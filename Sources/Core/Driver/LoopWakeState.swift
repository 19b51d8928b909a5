import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The sleeping/awake word and counters of an `EventRegistry`: how a wake
/// from another thread finds out whether the registry's owner sleeps, and
/// where.
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

    /// How early a timed sleep on the wake word ends, so that the rest,
    /// spun, ends on time: as late as the kernel has recently been in ending
    /// such sleeps on this machine (`WakeLead`). It starts at 40 µs, and is
    /// at most 200 µs.
    private var lead = WakeLead()
    // Owner-only: read and updated by the registry's owner in its waits.

    /// The deadline to sleep until for a wait that must end at `deadline`;
    /// nil for the distant future (an untimed sleep).
    private func sleepDeadline(for deadline: MonotonicClock.Instant) -> MonotonicClock.Instant? {
        deadline.isDistantFuture ? nil : deadline.advanced(by: .nanoseconds(-lead.nanoseconds))
    }

    /// Spins (bounded by `spinBeforeSleep`, or by `deadline` if it comes
    /// first) while no wake is pending. Returns true when a wake arrived.
    func spinForWake(until deadline: MonotonicClock.Instant?, atMost: Duration = spinBeforeSleep) -> Bool {
        let start = MonotonicClock.now
        var limit = start.advanced(by: atMost)
        if let deadline, deadline < limit { limit = deadline }
        while true {
            if AtomicMemory.load(from: state, ordering: .relaxed) == Self.woken { return true }
            for _ in 0..<16 { spinLoopHint() }
            // The clock every round: a round of pause hints takes 0.1–1 µs
            // by processor family (0.4 µs on an AMD EPYC VM), a vDSO clock
            // read about 25 ns. A spin that read it only every 8th round
            // would end up to 8 rounds (3.2 µs there) after its deadline:
            // a 1 ms loop timer's median lateness was 6–7 µs that way, and
            // is 2 µs this way.
            if MonotonicClock.now >= limit { return false }
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

    /// Whether the loop is in a sleep (the kernel's wait or the wake word's)
    /// now, stale at once (tests).
    var isSleepingForTesting: Bool {
        let now = AtomicMemory.load(from: state, ordering: .relaxed)
        return now == Self.sleepingInKernel || now == Self.sleepingOnFutex
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

    /// The part of a wait that needs no kernel wait, for a registry that
    /// watches no descriptor (`descriptorsArmed` false): a short spin for a
    /// wake already on its way, then a sleep on the wake word that ends
    /// the learned lead (`WakeLead`) before `deadline`, and a spin for the rest. With
    /// descriptors armed it does nothing: the wait sleeps in the kernel at
    /// once. Call only with a wait that may block (a non-zero timeout).
    /// `precise` false: no spin at all, a sleep on the wake word until the
    /// deadline (as late as the kernel is in ending it, at one wake-up).
    func waitBeforeKernel(
        until deadline: MonotonicClock.Instant?, descriptorsArmed: Bool, precise: Bool = true
    ) -> Prelude {
        // With descriptors armed the spin would watch only the wake word,
        // never the descriptors: each of their events would cost the whole
        // spin in CPU, and one arriving during it would wait for its end.
        guard !descriptorsArmed else { return .sleepInKernel }
        guard precise else { return sleepOnFutex(until: deadline) ? .woken : .timedOut }
        if spinForWake(until: deadline) {
            leaveSleep()
            return .woken
        }
        guard let deadline, let sleepUntil = sleepDeadline(for: deadline) else {
            return sleepOnFutex(until: nil) ? .woken : .timedOut
        }
        // A deadline closer than the lead is spun for without a sleep.
        if MonotonicClock.now < sleepUntil {
            if sleepOnFutex(until: sleepUntil) { return .woken }
            // The sleep timed out: learn how late the kernel ended it.
            lead.learn(overshoot: sleepUntil.duration(to: MonotonicClock.now))
        }
        if spinForWake(until: deadline, atMost: .nanoseconds(WakeLead.maximum)) {
            leaveSleep()
            return .woken
        }
        return .timedOut
    }

    var statistics: EventBackendStatistics {
        EventBackendStatistics(
            wakeRequests: AtomicMemory.load(from: words + 1),
            wakeSyscalls: AtomicMemory.load(from: words + 2),
            waitSyscalls: AtomicMemory.load(from: words + 3))
    }
}

/// How early a loop's timed sleep ends, learned from how late the kernel
/// ends such sleeps here.
///
/// A thread whose futex sleep times out runs again only once the kernel has
/// switched it in: a few microseconds on an idle bare-metal core, 20–60 µs on
/// a virtual CPU the host must wake. A loop that slept until its timer's
/// deadline would fire every timer that late (as Foundation's run loop
/// does), so the loop sleeps until `nanoseconds` before the deadline and
/// spins the rest. A fixed lead is right for one machine only: too short and
/// timers are late, too long and every timed wake-up spins for nothing. So
/// the lead follows the slow end of the observed overshoots (how long after
/// its requested end each timed-out sleep returned), plus a 2 µs margin: it
/// rises by an eighth of the gap when a sleep overshoots it and falls by a
/// sixty-fourth when one does not. Steady 55 µs wake-ups give 55–57 µs;
/// 5 µs ones with a 50 µs one in ten settle near 26 µs. The CPU cost per timed wake-up is the spin: the lead minus
/// that wake-up's own overshoot, at most `maximum`.
struct WakeLead {
    static let initial: Int64 = 40_000
    static let minimum: Int64 = 2_000
    static let maximum: Int64 = 200_000
    static let margin: Int64 = 2_000

    /// The estimate of the overshoot quantile, in nanoseconds.
    private var estimate = initial - margin

    /// How early to end a timed sleep, in nanoseconds.
    var nanoseconds: Int64 { min(max(estimate + Self.margin, Self.minimum), Self.maximum) }

    /// Learns from one timed-out sleep that returned `overshoot` after its
    /// requested end. One preempted sleep (milliseconds late) moves the
    /// estimate by at most an eighth of `maximum`.
    mutating func learn(overshoot: Duration) {
        let late = min(max(overshoot.nanosecondsSaturating, 0), Self.maximum)
        if late > estimate {
            estimate += (late - estimate + 7) / 8
        } else {
            estimate -= (estimate - late + 63) / 64
        }
    }
}
