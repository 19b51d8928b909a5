import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Seeded schedule perturbation: an opt-in test mode in which Spindle's
/// synchronization points (lock acquire and release, condition wait and
/// signal, semaphore wait and signal, queue submission, a pool worker
/// choosing its next item, a run loop waking) now and then yield the CPU,
/// delay the calling thread for microseconds, or make a different choice
/// of ready work where the API's ordering allows it, by a seeded
/// pseudo-random draw. A stress test then runs through interleavings that
/// an idle machine almost never produces (a thread preempted between an
/// unlock and the next lock, a signaller overtaking a waiter, a later
/// item overtaking an earlier one on another worker), and a seed that found
/// a failure replays the same decisions.
///
/// Switch it on for a whole process with the environment:
///
/// ```
/// SPINDLE_PERTURB=1234 swift test --filter MyStressTests
/// SPINDLE_PERTURB=random swift test --filter MyStressTests   # a fresh seed, printed
/// ```
///
/// or from code, before the threads under test start, with
/// `enable(seed:)`. When the mode is on, the seed is printed to standard
/// error once, as the line that replays it:
/// `Spindle: schedule perturbation on, SPINDLE_PERTURB=1234`.
///
/// Replay. Each thread draws from its own generator, seeded with the seed
/// and the thread's number, which counts threads in the order of their
/// first synchronization point. The same seed gives each thread the same
/// sequence of decisions; the run replays as far as the threads are
/// numbered in the same order and meet their points in the same order,
/// which the kernel's own scheduling can still change. It is a way to make
/// rare interleavings common, not a deterministic scheduler.
///
/// <doc:PerturbingSchedules> lists every point, what each perturbs, and
/// how often it found planted bugs.
///
/// Never breaks a guarantee: locks still exclude, a serial queue still runs
/// its items one at a time in order, a barrier still runs alone; only the
/// timing and the choices the pool was already free to make change.
///
/// Cost when off: one relaxed load of a global word and a branch not taken
/// at each point; the work is out of line. On: a thread-local generator
/// step per point, plus the delays it chooses (most points do nothing or
/// yield; one in thirty-two sleeps, up to 2 ms), so a test that
/// synchronizes often runs several times slower.
public enum SchedulePerturbation {
    /// Switches the mode on for the whole process with `seed`, and prints
    /// the seed to standard error. Call it before starting the threads
    /// whose schedule you want perturbed: threads are numbered, and their
    /// generators seeded, at their first point after this call.
    ///
    /// `SPINDLE_PERTURB` in the environment takes precedence: if it is set,
    /// the environment's seed stays in force and `seed` is ignored, so a
    /// test that enables a fixed seed can be run with another one (or
    /// replayed) from the command line. Calling it again with the seed in
    /// force does nothing. Never blocks; orders nothing but the seed.
    ///
    /// Misuse: a second call with a different seed stops the process with
    /// a message (threads already drew from the first seed's generators).
    /// An unparsable `SPINDLE_PERTURB` stops the process too.
    public static func enable(seed: UInt64) {
        Perturbation.configureFromEnvironment()
        if cshims_perturb_change_mode(0, Perturbation.Mode.changing) != 0 {
            cshims_perturb_set_seed(seed)
            _ = cshims_perturb_change_mode(Perturbation.Mode.changing, Perturbation.Mode.on)
            Perturbation.announce(seed)
            return
        }
        while cshims_perturb_mode_acquiring() == Perturbation.Mode.changing { spinLoopHint() }
        let current = cshims_perturb_seed()
        if Perturbation.environmentSeed != nil || current == seed { return }
        misuse("SchedulePerturbation.enable(seed: \(seed)): perturbation is already on with seed \(current); a process has one seed")
    }

    /// The seed in force, or nil while the mode is off. Reads
    /// `SPINDLE_PERTURB` if nothing has yet. Never blocks.
    public static var seed: UInt64? {
        Perturbation.configureFromEnvironment()
        guard cshims_perturb_mode_acquiring() == Perturbation.Mode.on else { return nil }
        return cshims_perturb_seed()
    }

    /// Whether the mode is on (`seed != nil`).
    public static var isEnabled: Bool { seed != nil }
}

/// The hooks that Spindle's synchronization points call, and the policy
/// behind them. See `SchedulePerturbation` for the contract.
///
/// What is perturbed, and why (the anchors):
/// - **Delays at synchronization points**, not at every memory access:
///   rr's chaos mode found that many bugs need a thread starved for a long
///   time and others a very short delay inside a narrow window, so it makes
///   short delays frequent and long ones rare. Here: half the points do
///   nothing, about a third yield, one in six spins 1–16 µs, and one in
///   thirty-two sleeps 20 µs–2 ms; a quarter of the threads (chosen by the
///   seed, as rr picks low-priority threads) delay at three points in four
///   and sleep eight times as often, so some threads lag for a whole run.
/// - **A different choice of ready work where the order is free**: Go's
///   scheduler under `-race` randomly declines its `runnext` slot, so a
///   goroutine that "always" ran next to its creator sometimes runs after
///   other work or on another P. The pool does the same with its next-unit
///   slot, and sometimes steals before looking at its own ring; neither
///   changes an order a queue promises.
/// - **Seeded, per thread**: Loom and Coyote control every scheduling point
///   and can replay a schedule exactly; a library in a real process cannot
///   (the kernel schedules), so each thread's decisions are a function of
///   the seed and its number alone, and a failure's seed brings back the
///   same decisions.
@usableFromInline
enum Perturbation {
    /// Where a point is: named for the message and the tests; every site
    /// draws from the same policy.
    @usableFromInline
    enum Site: UInt8, Sendable {
        case lockAcquire, lockRelease
        case conditionWait, conditionSignal
        case semaphoreWait, semaphoreSignal
        case queueSubmit, workerPick
        case loopWake

        /// Points where the thread is about to wait (see `nextAction`).
        var isWaitEntry: Bool { self == .conditionWait || self == .semaphoreWait }
    }

    /// What a point does.
    package enum Action: Equatable, Sendable, CustomStringConvertible {
        case proceed
        case yield
        /// Spins (holding the CPU) for this many nanoseconds.
        case spin(nanoseconds: Int64)
        /// Sleeps in the kernel for this many nanoseconds.
        case sleep(nanoseconds: Int64)

        package var description: String {
            switch self {
            case .proceed: "proceed"
            case .yield: "yield"
            case .spin(let ns): "spin \(ns)ns"
            case .sleep(let ns): "sleep \(ns)ns"
            }
        }
    }

    /// Values of `cshims_perturb_mode`.
    enum Mode {
        static let off: UInt32 = 0
        static let unread: UInt32 = 1
        static let on: UInt32 = 2
        /// `enable(seed:)` is writing the seed.
        static let changing: UInt32 = 3
    }

    /// A synchronization point: does nothing unless the mode is on (one
    /// relaxed load and a branch).
    @inlinable
    @inline(__always)
    static func point(_ site: Site) {
        if cshims_perturb_mode() != 0 { perturb(site) }
    }

    /// A choice between the usual pick of ready work and another one the
    /// API allows: true (take the other) only when the mode is on and the
    /// draw says so, about one time in four.
    @inlinable
    @inline(__always)
    static func choose(_ site: Site) -> Bool {
        cshims_perturb_mode() != 0 && chooseOtherwise(site)
    }

    @usableFromInline
    @inline(never)
    static func perturb(_ site: Site) {
        guard isOn() else { return }
        perform(nextAction(at: site))
    }

    @usableFromInline
    @inline(never)
    static func chooseOtherwise(_ site: Site) -> Bool {
        guard isOn() else { return false }
        return draw() & 3 == 0
    }

    /// Whether the mode is on, reading the environment at the first call.
    static func isOn() -> Bool {
        var mode = cshims_perturb_mode_acquiring()
        if mode == Mode.unread {
            configureFromEnvironment()
            mode = cshims_perturb_mode_acquiring()
        }
        return mode == Mode.on
    }

    /// `SPINDLE_PERTURB`, parsed once: nil when unset or empty.
    static let environmentSeed: UInt64? = {
        guard let raw = getenv("SPINDLE_PERTURB") else { return nil }
        let text = String(cString: raw)
        if text.isEmpty { return nil }
        if text == "random" { return UInt64.random(in: 0...UInt64.max) }
        guard let seed = UInt64(text) else {
            misuse("SPINDLE_PERTURB is '\(text)'; use a decimal seed (0 to \(UInt64.max)) or 'random'")
        }
        return seed
    }()

    /// Reads the environment once; turns the mode on with its seed, or off
    /// if it is unset (unless `enable(seed:)` turned it on first).
    static func configureFromEnvironment() {
        _ = environmentConfigured
    }

    private static let environmentConfigured: Void = {
        if let seed = environmentSeed {
            cshims_perturb_set_seed(seed)
            // Releasing (in the exchange): the seed before the mode.
            if cshims_perturb_change_mode(Mode.unread, Mode.on) != 0 { announce(seed) }
        } else {
            _ = cshims_perturb_change_mode(Mode.unread, Mode.off)
        }
    }()

    /// Prints the line that replays `seed`.
    static func announce(_ seed: UInt64) {
        // One write(2) on descriptor 2: no stdio buffer or lock, and the
        // line stays whole beside other threads' output.
        var line = "Spindle: schedule perturbation on, SPINDLE_PERTURB=\(seed)\n"
        line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    }

    // MARK: The per-thread generator

    /// The calling thread's next 64 random bits (splitmix64, whose output is
    /// well mixed even for consecutive states). Seeds the thread's state at
    /// its first draw from the seed and the thread's number.
    static func draw() -> UInt64 {
        let words = cshims_perturb_thread_state()!
        if words[1] == 0 {
            let index = UInt64(cshims_perturb_claim_thread_index())
            words[1] = index + 1
            // Distinct threads, distinct streams: the index scrambled into
            // the seed (a splitmix step of its own).
            words[0] = mix(cshims_perturb_seed() ^ mix(index &+ 0x5EED))
        }
        words[0] &+= 0x9E37_79B9_7F4A_7C15
        return mix(words[0])
    }

    static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// The calling thread's number (0 for the first thread that drew), or
    /// nil if it has not drawn yet.
    package static var currentThreadIndex: Int? {
        let words = cshims_perturb_thread_state()!
        return words[1] == 0 ? nil : Int(words[1] - 1)
    }

    /// Whether the calling thread is one of the slow quarter: decided by
    /// the seed and its number alone.
    static func isSlowThread() -> Bool {
        let words = cshims_perturb_thread_state()!
        return mix(cshims_perturb_seed() &+ words[1] &* 0xD1B5_4A32_D192_ED03) & 3 == 0
    }

    /// The calling thread's next decision (draws once).
    package static func nextAction(at site: Site) -> Action {
        let r = draw()
        let slow = isSlowThread()
        let b = r & 0xFF
        let rest = Int64(truncatingIfNeeded: r >> 8 & 0xFFFF)
        // Out of 256: a normal thread proceeds 128, yields 80, spins 40,
        // sleeps briefly 6, long 2; a slow one proceeds 64, yields 64,
        // spins 64, sleeps briefly 48, long 16.
        let (proceed, yield, spin, brief) = slow ? (64, 128, 192, 240) : (128, 208, 248, 254)
        // A thread about to wait never just proceeds: the interval between
        // testing a predicate and being counted as a waiter is where
        // wake-ups are lost, and the thread is about to give up its CPU
        // anyway. What would have been "proceed" spins instead.
        if b < UInt64(proceed) && site.isWaitEntry { return .spin(nanoseconds: 1_000 + rest % 15_000) }
        switch b {
        case ..<UInt64(proceed): return .proceed
        case ..<UInt64(yield): return .yield
        case ..<UInt64(spin): return .spin(nanoseconds: 1_000 + rest % 15_000)
        case ..<UInt64(brief): return .sleep(nanoseconds: 20_000 + rest % 180_000)
        default: return .sleep(nanoseconds: 200_000 + rest % 1_800_000)
        }
    }

    static func perform(_ action: Action) {
        switch action {
        case .proceed:
            return
        case .yield:
            sched_yield()
        case .spin(let ns):
            let end = MonotonicClock.now.nanoseconds &+ ns
            while MonotonicClock.now.nanoseconds < end { spinLoopHint() }
        case .sleep(let ns):
            var request = timespec(tv_sec: Int(ns / 1_000_000_000), tv_nsec: Int(ns % 1_000_000_000))
            _ = nanosleep(&request, nil)
        }
    }
}
