import CShims

/// A lock for tasks: held by a task across `await`s, and acquired by
/// suspending the task, never by blocking its thread.
///
/// ```swift
/// let cacheLock = AsyncLock()
/// try await cacheLock.withLock {
///     let fresh = try await fetch(key)       // the lock stays held across the await
///     cache[key] = fresh
/// }
/// ```
///
/// `Lock` and the other thread locks belong to a thread: a task that holds
/// one across a suspension point may resume on another thread (whose unlock
/// is then misuse) and, while suspended, keeps every other thread that wants
/// the lock asleep. `AsyncLock` is what to use instead when a critical
/// section has to `await`: its holder is whoever called `lock()`, and a task
/// that finds it held waits in line, suspended, while its thread runs other
/// tasks.
///
/// - Uncontended, `lock()` and `unlock()` are one compare-and-swap each,
///   inlined into the caller, with no allocation.
/// - A contended `lock()` puts the task at the end of a line (FIFO) and
///   suspends it. `unlock()` with tasks in line does not release the lock: it
///   hands it, still locked, to the first task in line and resumes that
///   task. Nobody can take the lock past the line (no barging, not even by
///   `tryLock()`), so no waiter starves.
///
/// Memory: a `lock()` (or a `tryLock()` that returns true) acquires and
/// `unlock()` releases: what a task wrote before `unlock()` is visible to the
/// task whose `lock()` returns next, on whatever thread it resumes.
///
/// Cancellation: see `lock()`. Fairness is strict FIFO among suspended
/// tasks; a task resumed with the lock runs when its executor schedules it,
/// and the lock stays held for it meanwhile.
///
/// Misuse: `unlock()` of a lock that is not held stops the process with a
/// message. The lock does not record which task holds it: any task may
/// unlock a held lock (as with a binary semaphore), and unlocking on behalf
/// of another holder is the caller's own bookkeeping. Not recursive: a task
/// that calls `lock()` while it holds the lock waits for itself forever.
/// It has no blocking form: code outside a task may call `tryLock()` and
/// `unlock()` but cannot wait for the lock (use `Lock` between threads).
public final class AsyncLock: @unchecked Sendable {
    // @unchecked: `waiters` and `deadlineTimers` are only touched holding
    // the guard word (`Words.guardWord`); everything else is the heap block
    // `base`, reached only through atomics.

    /// The lock's words, laid out by this struct (read through
    /// `MemoryLayout.offset(of:)`, never by hand-written offsets).
    ///
    /// `state`:
    ///
    ///     0                 unlocked; nobody waits (a lock with waiters is
    ///                       never unlocked: `unlock()` hands it over)
    ///     locked            held, nobody in line: `unlock()` clears it with
    ///                       one compare-and-swap
    ///     locked | queued   held, tasks in line: `unlock()` takes the guard
    ///                       and hands the lock to the first of them
    ///
    /// `queued` is set and cleared only holding the guard, and holding the
    /// guard it is set exactly when `waiters` is not empty.
    @usableFromInline
    struct Words {
        /// The lock state (see above).
        @usableFromInline var state: UInt32
        /// The plain mutex word guarding `waiters` (`PlainFutexMutex`),
        /// held for a few instructions at a time, never across a suspension.
        @usableFromInline var guardWord: UInt32
        /// The last number given to a waiting task (atomic), by which its
        /// cancellation handler or deadline timer finds it in `waiters`.
        @usableFromInline var lastWaiter: Int
    }

    /// How a suspended `lock()` ended.
    @usableFromInline
    enum Outcome: Sendable {
        /// The lock was handed to the task (or taken by it on the way in).
        case acquired
        /// The task left the line (or never joined it) because it was cancelled.
        case cancelled
        /// The deadline passed before the lock was handed to the task.
        case timedOut
    }

    @usableFromInline static var locked: UInt32 { 1 }
    @usableFromInline static var queued: UInt32 { 2 }

    /// The words (`Words`), in a cache-line block that never moves.
    @usableFromInline let base: UnsafeMutableRawPointer

    /// Tasks waiting in line, oldest first, each with the number by which
    /// its cancellation handler finds it and its deadline (`.distantFuture`
    /// for none). Guarded by `guardWord`.
    private var waiters: [(id: Int, continuation: UnsafeContinuation<Outcome, Never>, deadline: MonotonicClock.Instant)] = []

    /// The instants of the deadline timers this lock has scheduled that have
    /// not run yet, latest first: a timer is scheduled only for a deadline
    /// earlier than every one pending, so the last is the earliest, and
    /// timers run in this order. Guarded by `guardWord`.
    ///
    /// The lock keeps one timer for the earliest deadline in its line, not
    /// one per waiting task (the timer queue cannot cancel a timer): when it
    /// runs, it times out the tasks whose deadlines have passed and, if
    /// tasks with deadlines remain, schedules one for the earliest of them
    /// (unless an earlier timer is pending). Invariant, holding the guard:
    /// if a task in line has a deadline, the last element is at or before
    /// the earliest such deadline. A task served or cancelled before its
    /// deadline takes its deadline out of the line with it, and a timer that
    /// finds nothing due does nothing; timers capture the lock weakly. So a
    /// stream of contended `lock(timeout:)` calls with one timeout keeps at
    /// most one timer pending, whatever the timeout.
    private var deadlineTimers: [MonotonicClock.Instant] = []

    /// An unlocked lock. Allocates one cache line for its words.
    public init() {
        base = allocateStableWords(byteCount: MemoryLayout<Words>.size)
    }

    deinit {
        if LockHooks.isChecking { LockOrder.forget(UInt(bitPattern: state)) }
        deallocateStableWords(base)
    }

    @inlinable
    var state: UnsafeMutablePointer<UInt32> {
        (base + MemoryLayout<Words>.offset(of: \Words.state)!).assumingMemoryBound(to: UInt32.self)
    }

    @usableFromInline
    var guardMutex: PlainFutexMutex {
        PlainFutexMutex(word: (base + MemoryLayout<Words>.offset(of: \Words.guardWord)!).assumingMemoryBound(to: UInt32.self))
    }

    @usableFromInline
    var lastWaiter: UnsafeMutablePointer<Int> {
        (base + MemoryLayout<Words>.offset(of: \Words.lastWaiter)!).assumingMemoryBound(to: Int.self)
    }

    // MARK: Locking

    /// Takes the lock, suspending the calling task (never blocking its
    /// thread) while another holder has it. Tasks that wait are served in
    /// the order they arrived; `unlock()` hands the lock to the first.
    /// Acquire ordering (pairs with the `unlock()` that released or handed
    /// over the lock). Uncontended: one compare-and-swap, no allocation, no
    /// suspension. The call runs in the caller's isolation (`isolation`, as
    /// `withTaskCancellationHandler` does), so an actor's call does not hop
    /// off the actor.
    ///
    /// Cancellation: a task that is cancelled while it waits in line (or is
    /// cancelled already when it finds the lock held) leaves the line and the
    /// call throws `CancellationError`, holding nothing; the tasks behind it
    /// move up. A task that finds the lock free takes it whether cancelled or
    /// not, and so does one whose cancellation comes after an `unlock()` had
    /// already handed it the lock: the lock is its own then, and the call
    /// returns normally holding it (the caller must unlock it).
    @inlinable
    public func lock(isolation: isolated (any Actor)? = #isolation) async throws(CancellationError) {
        LockHooks.willLock(state, .asyncLock)
        // Acquiring: pairs with the releasing compare-and-swap in `unlock`.
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: state, ordering: .acquiring) {
            if await lockContended(until: .distantFuture) == .cancelled { throw CancellationError() }
        }
        LockHooks.didTryLock(state, .asyncLock)
    }

    /// As `lock()`, but gives up at `deadline` on the monotonic clock:
    /// returns true holding the lock, or false (holding nothing, having left
    /// the line) if the lock was not handed to the task by then. A deadline
    /// already past takes the lock only if it is free now;
    /// `.distantFuture` waits as `lock()`. Suspends, never blocks. Acquire
    /// ordering when it returns true. Cancellation as for `lock()` (throws
    /// `CancellationError`, holding nothing).
    ///
    /// The deadline is kept by the lock's one timer on `WorkQueue.global()`
    /// for the earliest deadline in its line; a task served or cancelled
    /// before its deadline leaves nothing behind (a timer already scheduled
    /// for it runs at its time, finds nothing due, and holds only a weak
    /// reference to the lock meanwhile). A later task with an earlier
    /// deadline schedules a timer of its own.
    @inlinable
    public func lock(
        until deadline: MonotonicClock.Instant, isolation: isolated (any Actor)? = #isolation
    ) async throws(CancellationError) -> Bool {
        LockHooks.willLock(state, .asyncLock)
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: state, ordering: .acquiring) {
            switch await lockContended(until: deadline) {
            case .acquired: break
            case .timedOut: return false
            case .cancelled: throw CancellationError()
            }
        }
        LockHooks.didTryLock(state, .asyncLock)
        return true
    }

    /// As `lock(until:)` with the deadline `timeout` from now.
    @inlinable
    public func lock(
        timeout: Duration, isolation: isolated (any Actor)? = #isolation
    ) async throws(CancellationError) -> Bool {
        try await lock(until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Takes the lock if it is free now. Never suspends, never blocks, never
    /// joins the line: a lock with tasks in line is not free (they are
    /// served first). Acquire ordering when it returns true.
    @inlinable
    public func tryLock() -> Bool {
        guard AtomicMemory.compareAndSwap(expected: 0, desired: Self.locked, at: state, ordering: .acquiring) else {
            return false
        }
        LockHooks.didTryLock(state, .asyncLock)
        return true
    }

    /// Releases the lock, or, if tasks wait in line, hands it (still locked)
    /// to the first of them and resumes that task. Never blocks (it takes the
    /// lock's internal guard for a few instructions when tasks wait). Release
    /// ordering. Stops the process with a message if the lock is not held.
    @inlinable
    public func unlock() {
        LockHooks.willUnlock(state, .asyncLock)
        // Releasing: pairs with the acquiring compare-and-swap of the next
        // `lock()` or `tryLock()`.
        if !AtomicMemory.compareAndSwap(expected: Self.locked, desired: 0, at: state, ordering: .releasing) {
            unlockContended()
        }
    }

    /// Runs `body` holding the lock, and unlocks on every way out of it
    /// (return, throw). The lock is held across the `await`s in `body`.
    /// Suspends while the lock is held elsewhere, as `lock()`; `body` runs
    /// in the caller's isolation. Throws `CancellationError` without running
    /// `body` if the task is cancelled while it waits to acquire (see
    /// `lock()`); otherwise returns what `body` returns and throws what it
    /// throws. Memory as `lock()` and `unlock()`. Misuse: unlocking the lock
    /// inside `body` makes the final unlock an unbalanced one (which stops the
    /// process, or releases another task's hold); calling `withLock` on the
    /// same lock inside `body` waits forever.
    @inlinable
    public func withLock<Result>(
        isolation: isolated (any Actor)? = #isolation,
        _ body: () async throws -> Result
    ) async throws -> Result {
        try await lock()
        defer { unlock() }
        return try await body()
    }

    /// Whether the lock is free with nobody in line: its idle state. A
    /// snapshot, for tests and diagnostics.
    package var isIdle: Bool {
        AtomicMemory.load(from: state, ordering: .relaxed) == 0 && waiterCount == 0
    }

    /// How many tasks in line have a deadline. A snapshot, for tests.
    package var deadlinesInLine: Int {
        let guardMutex = guardMutex
        guardMutex.lock()
        defer { guardMutex.unlock() }
        return waiters.count(where: { !$0.deadline.isDistantFuture })
    }

    /// How many deadline timers the lock has scheduled that have not run
    /// yet. A snapshot, for tests.
    package var pendingDeadlineTimers: Int {
        let guardMutex = guardMutex
        guardMutex.lock()
        defer { guardMutex.unlock() }
        return deadlineTimers.count
    }

    /// How many `lock` calls have taken the slow path (found the lock held)
    /// since the lock was made. A snapshot, for tests.
    package var contendedLockCalls: Int { AtomicMemory.load(from: lastWaiter, ordering: .relaxed) }

    /// How many tasks wait in line now. A snapshot, for tests.
    package var waiterCount: Int {
        let guardMutex = guardMutex
        guardMutex.lock()
        defer { guardMutex.unlock() }
        return waiters.count
    }

    // MARK: Slow paths

    /// The compare-and-swap found the lock held: join the line (or take the
    /// lock if it was freed meanwhile) and suspend until the lock is handed
    /// over, the task is cancelled, or `deadline` passes.
    @usableFromInline
    @inline(never)
    func lockContended(
        until deadline: MonotonicClock.Instant, isolation: isolated (any Actor)? = #isolation
    ) async -> Outcome {
        // Numbered before suspending, so that the cancellation handler knows
        // what to look for without a box shared with the operation.
        let id = AtomicMemory.add(1, to: lastWaiter, ordering: .relaxed)
        let outcome = await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Outcome, Never>) in
                let guardMutex = guardMutex
                guardMutex.lock()
                if let outcome = joinLine(before: deadline) {
                    guardMutex.unlock()
                    continuation.resume(returning: outcome)
                    return
                }
                waiters.append((id, continuation, deadline))
                // A timer only if none pending runs at or before this deadline.
                let arm = !deadline.isDistantFuture && (deadlineTimers.last.map { deadline < $0 } ?? true)
                if arm { deadlineTimers.append(deadline) }
                guardMutex.unlock()
                if arm { scheduleDeadlineTimer(at: deadline) }
            }
        } onCancel: {
            leaveLine(id, .cancelled)
        }
        if outcome == .acquired {
            // Acquiring: pairs with the releasing store with which `unlock`
            // handed the lock over (or with the compare-and-swap in
            // `joinLine`, which acquired already).
            _ = AtomicMemory.load(from: state, ordering: .acquiring)
        }
        return outcome
    }

    /// Holding the guard: takes the lock if it is free (`.acquired`), or
    /// declines to wait (`.cancelled`, `.timedOut`), or marks the lock
    /// `queued` and returns nil, for the caller to join the line before it
    /// lets go of the guard. The cancellation flag is set before the
    /// cancellation handler runs, and the handler takes the guard: either it
    /// finds the task in line, or this check sees the flag.
    private func joinLine(before deadline: MonotonicClock.Instant) -> Outcome? {
        var current = AtomicMemory.load(from: state, ordering: .relaxed)
        while true {
            if current & Self.locked == 0 {
                // Free, so nobody is in line (a lock with waiters is handed
                // over, never freed). Acquiring: pairs with `unlock`'s
                // releasing compare-and-swap.
                let r = AtomicMemory.compareExchange(
                    expected: current, desired: current | Self.locked, at: state, ordering: .acquiring)
                if r.exchanged { return .acquired }
                current = r.original
                continue
            }
            if Task.isCancelled { return .cancelled }
            if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return .timedOut }
            if current & Self.queued != 0 { return nil }
            // Relaxed: the holder's `unlock` now fails its fast path and
            // takes the guard, which orders it after our joining the line.
            let r = AtomicMemory.compareExchange(
                expected: current, desired: current | Self.queued, at: state, ordering: .relaxed)
            if r.exchanged { return nil }
            current = r.original
        }
    }

    /// Schedules the lock's deadline timer for `instant`, already recorded in
    /// `deadlineTimers`. Called without the guard.
    private func scheduleDeadlineTimer(at instant: MonotonicClock.Instant) {
        // Weakly: a pending timer must not keep a lock nobody uses alive for
        // as long as a timeout (a task in line holds the lock strongly, as
        // `self` of its `lock` call, so no waiter is lost with it).
        WorkQueue.global().async(after: instant) { [weak self] in self?.deadlineTimerRan() }
    }

    /// A deadline timer ran: times out every task in line whose deadline has
    /// passed, and keeps the invariant of `deadlineTimers` for the rest.
    private func deadlineTimerRan() {
        let guardMutex = guardMutex
        guardMutex.lock()
        // Timers run in the order they were scheduled for; the earliest is
        // last. (Two due at once may run in either order: either pops one of
        // them, and the other is about to run.)
        _ = deadlineTimers.popLast()
        let now = MonotonicClock.now
        var expired: [UnsafeContinuation<Outcome, Never>] = []
        var earliest = MonotonicClock.Instant.distantFuture
        waiters.removeAll { waiter in
            if waiter.deadline <= now {
                expired.append(waiter.continuation)
                return true
            }
            if waiter.deadline < earliest { earliest = waiter.deadline }
            return false
        }
        if !expired.isEmpty && waiters.isEmpty {
            // Held (tasks wait only for a held lock): back to plain
            // `locked`, so that its holder's unlock is the fast one.
            AtomicMemory.and(~Self.queued, into: state, ordering: .relaxed)
        }
        let arm = !earliest.isDistantFuture && (deadlineTimers.last.map { earliest < $0 } ?? true)
        if arm { deadlineTimers.append(earliest) }
        guardMutex.unlock()
        if arm { scheduleDeadlineTimer(at: earliest) }
        for continuation in expired { continuation.resumeOutsideTSan(returning: .timedOut) }
    }

    /// A waiting task's cancellation: if it is still in line, it leaves the
    /// line (its deadline with it) and is resumed with `outcome`. Not in
    /// line any more, it was handed the lock (it keeps it) or timed out. Not
    /// in line yet (the task has not taken the guard), it sees the
    /// cancellation itself when it gets there.
    private func leaveLine(_ id: Int, _ outcome: Outcome) {
        let guardMutex = guardMutex
        guardMutex.lock()
        guard let index = waiters.firstIndex(where: { $0.id == id }) else {
            guardMutex.unlock()
            return
        }
        let continuation = waiters.remove(at: index).continuation
        if waiters.isEmpty {
            // The lock is held (tasks wait only for a held lock): back to
            // plain `locked`, so that its holder's unlock is the fast one.
            AtomicMemory.and(~Self.queued, into: state, ordering: .relaxed)
        }
        guardMutex.unlock()
        continuation.resumeOutsideTSan(returning: outcome)
    }

    /// The fast unlock failed: the lock has tasks in line, or it is not
    /// held (misuse).
    @usableFromInline
    @inline(never)
    func unlockContended() {
        let guardMutex = guardMutex
        guardMutex.lock()
        // Holding the guard, the state cannot change under us: `queued`
        // changes only under the guard, and a held lock's `locked` bit only
        // by its holder, which is this call.
        let current = AtomicMemory.load(from: state, ordering: .relaxed)
        guard current & Self.locked != 0 else {
            guardMutex.unlock()
            misuse("AsyncLock.unlock(): the lock is not locked (unbalanced unlock, or unlock before lock)")
        }
        guard !waiters.isEmpty else {
            // `queued` was cleared by a waiter that left the line after our
            // fast path looked. Releasing: as the fast path.
            AtomicMemory.store(0, to: state, ordering: .releasing)
            guardMutex.unlock()
            return
        }
        let heir = waiters.removeFirst().continuation
        // Hand over: the lock stays locked. Releasing: pairs with the heir's
        // acquiring load when it resumes (`lockContended`).
        AtomicMemory.store(
            waiters.isEmpty ? Self.locked : Self.locked | Self.queued, to: state, ordering: .releasing)
        guardMutex.unlock()
        heir.resumeOutsideTSan(returning: .acquired)
    }
}
