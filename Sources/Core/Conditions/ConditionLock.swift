import CShims

/// A lock with an integer condition: Spindle's `NSConditionLock`.
///
/// The lock holds an `Int` that your program defines (the guide's producer
/// and consumer use `noData` and `hasData`). `lock(whenCondition: c)` waits
/// until the lock is free *and* its condition is `c`; `unlock(withCondition:
/// c)` releases it and sets the condition in one step. The plain `lock()`
/// and `unlock()` ignore and keep the condition; all combinations may be
/// used: `lock()` with `unlock(withCondition:)`, `lock(whenCondition:)` with
/// `unlock()` (which keeps the condition, so it wakes only threads waiting
/// for the condition the lock already has).
///
/// - Targeted wake-ups: each waiting thread records the condition it waits
///   for and sleeps on a futex word of its own, in one line, oldest first.
///   An unlock picks the longest waiting thread that the new condition lets
///   in (one waiting for that condition, or for any) and wakes only that
///   one, and only if it sleeps (and is not already woken); threads waiting
///   for other conditions stay asleep. No thundering herd; a thread keeps
///   its place in the line until it holds the lock, so among threads waiting
///   for the same condition, first come first served.
/// - Barging with eventual fairness, as `Lock` (parking_lot's design): an
///   unlock frees the lock and the thread it wakes competes for it, so a
///   thread that arrives meanwhile (a `lock` call or a `tryLock`) may take
///   it first, as with a `pthread_mutex_t`; the lock is free between one
///   holder and the next, and a polling `tryLock` wins when it comes then
///   (were the lock handed to the woken thread, it would stay held through
///   every wake-up while threads wait, and a `tryLock` would never win).
///   The chosen thread, once it has waited `LockTuning.starvationBound`
///   (1 ms), is handed the lock directly, still locked, at most one such
///   hand-off per `LockTuning.fairHandoffInterval` (1 ms): so a waiter that
///   the condition admits waits at most about that bound plus one interval
///   per starving waiter ahead of it, however often others barge.
/// - A waiter spins before it sleeps (`futex(FUTEX_WAIT_BITSET)`), up to 13 µs
///   and only as long as spinning has been paying off on this lock
///   (`AdaptiveSpin`), so an unlock that frees the lock for a thread still
///   spinning (or hands it over) costs no system call.
/// - The lock's waiters, wake-ups and hand-offs are kept under a small
///   internal guard, a plain barging futex mutex (no fairness policy) held
///   only for a few instructions and never while anyone sleeps. Taking a free lock
///   (`tryLock`, and the first attempt of every lock call) is one
///   compare-and-swap on the lock's own word and does not touch the guard,
///   so `tryLock` never waits for another thread.
/// - Deadlines are on `MonotonicClock`; `.distantFuture` waits forever and a
///   deadline already past makes the call a `tryLock`.
///
/// `ConditionLock` is a handle: copies share one lock.
///
/// Memory: acquiring orders like an acquire and unlocking like a release,
/// as every `Locking` type; a hand-off releases in the unlocking thread and
/// acquires in the thread that receives the lock. The condition is written
/// only while the lock is held, so a thread that acquires sees the
/// condition its predecessor left.
///
/// Misuse: `unlock()` or `unlock(withCondition:)` of a lock that is not
/// locked stops the process with a message. Unlocking from a thread other
/// than the one that locked is not detected (Foundation's `NSConditionLock`
/// forbids it too). Not recursive: locking it again on the thread that holds
/// it deadlocks.
public struct ConditionLock: Locking, @unchecked Sendable {
    // @unchecked: the storage's plain fields are only touched under the
    // internal guard lock; the condition and the waiters' states are atomics.

    /// The lock's words, laid out by this struct (read through
    /// `MemoryLayout.offset(of:)`, never by hand-written offsets), from a
    /// cache-line aligned base. The base address itself names the lock in
    /// the name table (`LockNames`), so the first word is never used.
    @usableFromInline
    struct Words {
        /// Never used: its address is the lock's key for its name.
        @usableFromInline var unused: UInt32
        /// The guard's word (a `PlainFutexMutex`).
        @usableFromInline var guardWord: UInt32
        /// 1 while some thread holds the condition lock (atomic; set from 0
        /// with a compare-and-swap, with or without the guard; cleared or
        /// handed off only under it).
        @usableFromInline var held: UInt32
        /// The waiters' spin limit (`AdaptiveSpin`).
        @usableFromInline var spin: UInt32
        /// The condition (written under the guard, read anywhere).
        @usableFromInline var condition: Int
        /// The first waiter (guarded).
        @usableFromInline var firstWaiter: UnsafeMutableRawPointer?
        /// The last waiter (guarded).
        @usableFromInline var lastWaiter: UnsafeMutableRawPointer?
        /// When the lock was last handed to a starving waiter, in
        /// nanoseconds of the monotonic clock (guarded; 0 for never).
        @usableFromInline var lastFairHandOff: Int64
    }

    @usableFromInline
    final class Storage {
        @usableFromInline let base: UnsafeMutableRawPointer
        init(condition: Int) {
            base = allocateStableWords(byteCount: MemoryLayout<Words>.size)
            (base + MemoryLayout<Words>.offset(of: \.condition)!).storeBytes(of: condition, as: Int.self)
            (base + MemoryLayout<Words>.offset(of: \.spin)!).storeBytes(of: AdaptiveSpin.initialPolls, as: UInt32.self)
            LockHooks.tsanCreated(base + MemoryLayout<Words>.offset(of: \.held)!)
        }
        deinit {
            LockHooks.destroyed(base + MemoryLayout<Words>.offset(of: \.held)!)
            LockHooks.destroyed(base)
            LockNames.forget(base)
            deallocateStableWords(base)
        }
    }

    @usableFromInline let storage: Storage

    /// A name for the lock, for people reading diagnostics (Foundation's
    /// `NSConditionLock.name`): shown in `description` and in the message with which
    /// misuse stops the process. `nil` (the default) for none. Settable on
    /// any copy of the handle, from any thread; every copy sees it.
    ///
    /// Kept in a side table, not in the lock (see `LockNames` in the
    /// sources): an unnamed lock is no bigger and `lock()`/`unlock()` never reads
    /// the name. Reading or setting it takes that table's lock (it blocks
    /// only for another name's read or write) and orders nothing else.
    public var name: String? {
        get { LockNames.name(at: storage.base) }
        nonmutating set { LockNames.setName(newValue, at: storage.base) }
    }

    /// A new, unlocked lock whose condition is `condition`.
    public init(condition: Int = 0) {
        storage = Storage(condition: condition)
    }

    /// The word `field` of `Words`.
    @inlinable
    func word<T>(_ field: KeyPath<Words, T>) -> UnsafeMutablePointer<T> {
        (storage.base + MemoryLayout<Words>.offset(of: field)!).assumingMemoryBound(to: T.self)
    }

    @inlinable
    var guardLock: PlainFutexMutex { PlainFutexMutex(word: word(\.guardWord)) }

    @inlinable
    var held: UnsafeMutablePointer<UInt32> { word(\.held) }

    @inlinable
    var conditionWord: UnsafeMutablePointer<Int> { word(\.condition) }

    @inlinable
    var firstWaiter: UnsafeMutablePointer<UnsafeMutableRawPointer?> { word(\.firstWaiter) }

    @inlinable
    var lastWaiter: UnsafeMutablePointer<UnsafeMutableRawPointer?> { word(\.lastWaiter) }

    @inlinable
    var spin: AdaptiveSpin { AdaptiveSpin(word(\.spin)) }

    /// The lock's condition now. A snapshot: unless the caller holds the
    /// lock, another thread may change it at once. Never blocks; orders no
    /// other memory.
    public var condition: Int { AtomicMemory.load(from: conditionWord, ordering: .relaxed) }

    /// For tests: takes the internal guard, as an unlock or a waiter does for
    /// a few instructions, and keeps it until `unlockGuardForTesting()`.
    /// Blocks while another thread holds the guard.
    package func lockGuardForTesting() { guardLock.lock() }

    /// For tests: releases the guard taken by `lockGuardForTesting()`.
    package func unlockGuardForTesting() { guardLock.unlock() }

    // MARK: Locking, whatever the condition

    /// Acquires the lock whatever its condition, sleeping while another
    /// thread holds it. Blocks. Acquire ordering.
    @inlinable
    public func lock() {
        _ = acquire(anyCondition: true, wanted: 0, before: .distantFuture)
    }

    /// Acquires the lock whatever its condition if it is free now, even if
    /// threads wait for it (as `pthread_mutex_trylock`: the threads an unlock
    /// woke have not taken it yet). Never blocks: one compare-and-swap,
    /// without the internal guard. Acquire ordering on success.
    @inlinable
    public func tryLock() -> Bool {
        acquire(anyCondition: true, wanted: 0, before: MonotonicClock.Instant(nanoseconds: 0))
    }

    /// Acquires the lock whatever its condition, sleeping at most until
    /// `deadline`; returns whether it did. Blocks. Acquire ordering on
    /// success.
    @inlinable
    public func lock(before deadline: MonotonicClock.Instant) -> Bool {
        acquire(anyCondition: true, wanted: 0, before: deadline)
    }

    // MARK: Locking when the condition matches

    /// Acquires the lock once it is free and its condition is `condition`,
    /// sleeping until then. Blocks. Acquire ordering.
    @inlinable
    @available(*, noasync, message: "waits for another thread to set the condition; in async code use an `AsyncLock` or `await` a continuation")
    public func lock(whenCondition condition: Int) {
        _ = acquire(anyCondition: false, wanted: condition, before: .distantFuture)
    }

    /// Acquires the lock if it is free and its condition is `condition` now,
    /// even if threads wait for it (see `tryLock()`).
    /// Never waits for the lock; takes the internal guard (a few
    /// instructions) only in the rare case that the condition changed while
    /// it took the lock, to release it again. Acquire ordering on success.
    @inlinable
    public func tryLock(whenCondition condition: Int) -> Bool {
        acquire(anyCondition: false, wanted: condition, before: MonotonicClock.Instant(nanoseconds: 0))
    }

    /// Acquires the lock once it is free and its condition is `condition`,
    /// sleeping at most until `deadline`; returns whether it did. Blocks.
    /// Acquire ordering on success. `.distantFuture` waits forever; a
    /// deadline already past makes this `tryLock(whenCondition:)`.
    @inlinable
    @available(*, noasync, message: "waits for another thread to set the condition; in async code use an `AsyncLock` or `await` a continuation")
    public func lock(whenCondition condition: Int, before deadline: MonotonicClock.Instant) -> Bool {
        acquire(anyCondition: false, wanted: condition, before: deadline)
    }

    /// As `lock(whenCondition:before:)`, with a deadline `timeout` from now.
    @inlinable
    @available(*, noasync, message: "waits for another thread to set the condition; in async code use an `AsyncLock` or `await` a continuation")
    public func lock(whenCondition condition: Int, timeout: Duration) -> Bool {
        acquire(anyCondition: false, wanted: condition, before: MonotonicClock.now.advanced(by: timeout))
    }

    // MARK: Unlocking

    /// Releases the lock and keeps its condition. If threads wait for that
    /// condition (or for any), the one that has waited longest is woken (a
    /// system call only if it sleeps) and takes the lock unless another
    /// thread takes it first; once it has waited 1 ms, the lock is handed to
    /// it directly (see the type's notes). Only that thread wakes. Never
    /// blocks (beyond the internal guard). Release ordering. Stops the
    /// process with a message if the lock is not locked.
    @inlinable
    public func unlock() {
        LockHooks.willUnlock(storage.base, .conditionLock)
        LockHooks.tsanReleasing(held)
        let guardLock = self.guardLock
        guardLock.lock()
        release(guardLock, caller: "unlock()")
    }

    /// Sets the condition to `condition` and releases the lock, in one step.
    /// If threads wait for `condition` (or for any), the one that has waited
    /// longest is woken, as for `unlock()`, and only that thread; threads
    /// waiting for other conditions stay asleep. Never blocks (beyond the
    /// internal guard). Release ordering. Stops the process with a message
    /// if the lock is not locked.
    @inlinable
    public func unlock(withCondition condition: Int) {
        LockHooks.willUnlock(storage.base, .conditionLock)
        LockHooks.tsanReleasing(held)
        let guardLock = self.guardLock
        guardLock.lock()
        AtomicMemory.store(condition, to: conditionWord, ordering: .relaxed)
        release(guardLock, caller: "unlock(withCondition:)")
    }

    // MARK: Fast paths

    /// Takes the lock if it is free and its condition lets the caller in;
    /// otherwise waits until `deadline` (a deadline already past: returns
    /// false at once).
    /// A `tryLock` passes the deadline 0: it never waits, so the lock-order
    /// checker records it without looking for a cycle.
    @inlinable
    func acquire(anyCondition: Bool, wanted: Int, before deadline: MonotonicClock.Instant) -> Bool {
        Perturbation.point(.lockAcquire)
        let waits = deadline.nanoseconds != 0
        if waits { LockHooks.willLock(storage.base, .conditionLock) }
        guard take(anyCondition: anyCondition, wanted: wanted, before: deadline) else {
            if waits { LockHooks.lockFailed(storage.base, .conditionLock) }
            return false
        }
        LockHooks.tsanAcquired(held, waits ? 0 : LockHooks.tsanTry)
        if !waits { LockHooks.didTryLock(storage.base, .conditionLock) }
        return true
    }

    /// `acquire` without the hooks.
    @inlinable
    func take(anyCondition: Bool, wanted: Int, before deadline: MonotonicClock.Instant) -> Bool {
        if takeIfFree(anyCondition: anyCondition, wanted: wanted) { return true }
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return false }
        let guardLock = self.guardLock
        // The guard's acquire and release order the plain fields.
        guardLock.lock()
        if AtomicMemory.load(from: held, ordering: .relaxed) == 0
            && (anyCondition || AtomicMemory.load(from: conditionWord, ordering: .relaxed) == wanted)
            // Acquiring: pairs with the releasing store in `release`/`handOff`.
            && AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: held, ordering: .acquiring)
        {
            guardLock.unlock()
            return true
        }
        return acquireContended(guardLock, anyCondition: anyCondition, wanted: wanted, before: deadline)
    }

    /// Takes the lock without the guard if it is free and its condition lets
    /// the caller in. This barges: a waiter that the last unlock woke may be
    /// on its way to take it (a starving one is handed the lock instead,
    /// which keeps it held). Never blocks, except that a condition changed
    /// between the check and the take is released again through the guard
    /// (a few instructions).
    @inlinable
    func takeIfFree(anyCondition: Bool, wanted: Int) -> Bool {
        guard AtomicMemory.load(from: held, ordering: .relaxed) == 0,
            anyCondition || AtomicMemory.load(from: conditionWord, ordering: .relaxed) == wanted,
            // Acquiring: pairs with the releasing store in `release`/`handOff`.
            AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: held, ordering: .acquiring)
        else { return false }
        // The condition only changes while the lock is held: if it still
        // admits us after the take, it did then.
        if anyCondition || AtomicMemory.load(from: conditionWord, ordering: .relaxed) == wanted { return true }
        let guardLock = self.guardLock
        guardLock.lock()
        release(guardLock, caller: "unlock()")
        return false
    }

    /// Called holding the guard. Releases the lock (waking the first waiter
    /// that the condition now lets in, if any), or hands it to that waiter
    /// if it is starving. Releases the guard. Nobody waiting: one store.
    @inlinable
    func release(_ guardLock: PlainFutexMutex, caller: StaticString) {
        if AtomicMemory.load(from: held, ordering: .relaxed) == 0 {
            guardLock.unlock()
            misuse("\(LockNames.label("ConditionLock", storage.base)).\(caller): the lock is not locked (unbalanced unlock, or unlock before lock)")
        }
        if firstWaiter.pointee == nil {
            // Releasing: pairs with the acquiring compare-and-swap that takes
            // the lock next (`takeIfFree`, `acquire`, `awaitTurn`).
            AtomicMemory.store(0, to: held, ordering: .releasing)
            guardLock.unlock()
            return
        }
        releaseToWaiters(guardLock)
    }
}

// MARK: - Waiting and hand-off

extension ConditionLock {
    /// A waiting thread's record, on its stack, linked into the lock's list
    /// while it waits; its fields are `Fields`, read through
    /// `MemoryLayout.offset(of:)`.
    @usableFromInline
    struct Waiter {
        struct Fields {
            /// Awake, sleeping or granted (atomic; written under the guard,
            /// read by the waiter without it).
            var state: UInt32
            /// 1 if any condition will do (guarded).
            var anyCondition: UInt32
            /// The condition waited for (guarded).
            var wanted: Int
            /// The next waiter (guarded).
            var next: UnsafeMutableRawPointer?
            /// The previous waiter (guarded).
            var previous: UnsafeMutableRawPointer?
            /// When it joined the line, monotonic nanoseconds (guarded).
            var queuedAt: Int64
        }

        /// Running (spinning, or on its way to look at the lock under the
        /// guard): an unlock that frees the lock for it needs no wake call.
        static var awake: UInt32 { 0 }
        /// May be asleep on `state`: an unlock that frees the lock for it
        /// sets `awake` and wakes it.
        static var sleeping: UInt32 { 1 }
        /// The lock has been handed to this thread (and it left the line).
        static var granted: UInt32 { 2 }

        static var byteCount: Int { MemoryLayout<Fields>.size }
        static var alignment: Int { MemoryLayout<Fields>.alignment }

        let base: UnsafeMutableRawPointer

        func offset<T>(_ field: KeyPath<Fields, T>) -> Int { MemoryLayout<Fields>.offset(of: field)! }

        var state: UnsafeMutablePointer<UInt32> { (base + offset(\.state)).assumingMemoryBound(to: UInt32.self) }
        var anyCondition: Bool {
            get { base.load(fromByteOffset: offset(\.anyCondition), as: UInt32.self) != 0 }
            nonmutating set { base.storeBytes(of: newValue ? 1 : 0, toByteOffset: offset(\.anyCondition), as: UInt32.self) }
        }
        var wanted: Int {
            get { base.load(fromByteOffset: offset(\.wanted), as: Int.self) }
            nonmutating set { base.storeBytes(of: newValue, toByteOffset: offset(\.wanted), as: Int.self) }
        }
        var next: UnsafeMutableRawPointer? {
            get { base.load(fromByteOffset: offset(\.next), as: UnsafeMutableRawPointer?.self) }
            nonmutating set { base.storeBytes(of: newValue, toByteOffset: offset(\.next), as: UnsafeMutableRawPointer?.self) }
        }
        var previous: UnsafeMutableRawPointer? {
            get { base.load(fromByteOffset: offset(\.previous), as: UnsafeMutableRawPointer?.self) }
            nonmutating set { base.storeBytes(of: newValue, toByteOffset: offset(\.previous), as: UnsafeMutableRawPointer?.self) }
        }
        var queuedAt: Int64 {
            get { base.load(fromByteOffset: offset(\.queuedAt), as: Int64.self) }
            nonmutating set { base.storeBytes(of: newValue, toByteOffset: offset(\.queuedAt), as: Int64.self) }
        }

        func admits(_ condition: Int) -> Bool { anyCondition || wanted == condition }
    }

    /// Called holding the guard, the lock taken by another thread or its
    /// condition not the wanted one. Queues the caller and waits until it
    /// takes the lock, is handed it, or the deadline passes. Releases the
    /// guard.
    @usableFromInline
    @inline(never)
    func acquireContended(
        _ guardLock: PlainFutexMutex, anyCondition: Bool, wanted: Int, before deadline: MonotonicClock.Instant
    ) -> Bool {
        let now = MonotonicClock.now
        if !deadline.isDistantFuture && now >= deadline {
            guardLock.unlock()
            return false
        }
        return withUnsafeTemporaryAllocation(byteCount: Waiter.byteCount, alignment: Waiter.alignment) { buffer in
            let me = Waiter(base: buffer.baseAddress!)
            me.state.initialize(to: Waiter.awake)
            me.anyCondition = anyCondition
            me.wanted = wanted
            me.queuedAt = now.nanoseconds
            append(me)
            guardLock.unlock()
            return awaitTurn(me, guardLock, until: deadline)
        }
    }

    /// Waits, queued as `me`, until it takes the lock or is handed it (true)
    /// or the deadline passes (false); leaves the line either way.
    ///
    /// Whether to sleep is decided under the guard, and so is every unlock's
    /// choice (`releaseToWaiters`): either the unlock came first and the
    /// waiter finds the lock free here, or the waiter's `sleeping` came
    /// first and the unlock wakes it. A waiter leaves the line without the
    /// lock only when it found the lock held (its holder's unlock chooses
    /// again) or its condition not admitted (the unlock that set the
    /// condition chose another thread), so no wake-up is lost with it.
    func awaitTurn(_ me: Waiter, _ guardLock: PlainFutexMutex, until deadline: MonotonicClock.Instant) -> Bool {
        let futex = Futex(me.state)
        var timedOut = false
        while true {
            if !timedOut {
                // Loads only, to leave the holder's cache lines alone: until
                // the lock is handed over, or is free with a condition that
                // admits us.
                _ = spin.poll {
                    AtomicMemory.load(from: me.state, ordering: .relaxed) == Waiter.granted
                        || (AtomicMemory.load(from: held, ordering: .relaxed) == 0
                            && me.admits(AtomicMemory.load(from: conditionWord, ordering: .relaxed)))
                }
            }
            guardLock.lock()
            // Acquiring: pairs with the releasing exchange in `handOff`, which
            // publishes the previous holder's critical section.
            if AtomicMemory.load(from: me.state, ordering: .acquiring) == Waiter.granted {
                guardLock.unlock()
                return true
            }
            if AtomicMemory.load(from: held, ordering: .relaxed) == 0
                && me.admits(AtomicMemory.load(from: conditionWord, ordering: .relaxed))
                // Acquiring: pairs with the releasing store in `release` /
                // `releaseToWaiters`.
                && AtomicMemory.compareAndSwap(expected: 0, desired: 1, at: held, ordering: .acquiring)
            {
                unlink(me)
                guardLock.unlock()
                return true
            }
            if timedOut || (!deadline.isDistantFuture && MonotonicClock.now >= deadline) {
                unlink(me)
                guardLock.unlock()
                return false
            }
            AtomicMemory.store(Waiter.sleeping, to: me.state, ordering: .relaxed)
            guardLock.unlock()
            // Refused at once if an unlock set `awake` or `granted` since.
            let result = announcingBlocking { futex.wait(expecting: Waiter.sleeping, until: deadline) }
            timedOut = result == .timedOut
        }
    }

    /// Called holding the guard and the lock, with waiters queued: frees the
    /// lock and wakes the first waiter the condition admits (if it sleeps),
    /// or hands the lock to it if it is starving and a fair hand-off is due.
    /// Releases the guard.
    @usableFromInline
    @inline(never)
    func releaseToWaiters(_ guardLock: PlainFutexMutex) {
        let condition = AtomicMemory.load(from: conditionWord, ordering: .relaxed)
        var candidate = firstWaiter.pointee
        while let node = candidate, !Waiter(base: node).admits(condition) {
            candidate = Waiter(base: node).next
        }
        guard let node = candidate else {
            // Releasing: pairs with the acquiring compare-and-swap that takes
            // the lock next.
            AtomicMemory.store(0, to: held, ordering: .releasing)
            guardLock.unlock()
            return
        }
        let chosen = Waiter(base: node)
        if isFairHandOffDue(to: chosen) {
            handOff(to: chosen, guardLock)
            return
        }
        // Free the lock for whoever comes first: the chosen thread, or one
        // that barges. Releasing: pairs with the acquiring compare-and-swap
        // that takes it next.
        AtomicMemory.store(0, to: held, ordering: .releasing)
        // Awake already (spinning, woken by an earlier unlock, or on its way
        // to the guard): it will look at the lock without a wake call.
        let asleep = AtomicMemory.load(from: chosen.state, ordering: .relaxed) == Waiter.sleeping
        if asleep { AtomicMemory.store(Waiter.awake, to: chosen.state, ordering: .relaxed) }
        guardLock.unlock()
        // After releasing the guard, so that the woken thread does not run
        // into it. The thread may have left (woken spuriously or timed out,
        // it saw `awake` and took the lock) before this call: see `handOff`.
        if asleep { Futex(chosen.state).wake(1) }
    }

    /// Whether the lock goes to `chosen` directly: it has waited at least
    /// `LockTuning.starvationBound`, and the last such hand-off was at least
    /// `LockTuning.fairHandoffInterval` ago (records this one if so). Called
    /// holding the guard; reads the clock (vDSO), only with waiters queued.
    func isFairHandOffDue(to chosen: Waiter) -> Bool {
        let now = MonotonicClock.now.nanoseconds
        guard now &- chosen.queuedAt >= LockTuning.starvationBound.nanosecondsSaturating else { return false }
        let last = word(\.lastFairHandOff)
        guard now &- last.pointee >= LockTuning.fairHandoffInterval.nanosecondsSaturating else { return false }
        last.pointee = now
        return true
    }

    /// Called holding the guard: hands the lock, still held, to `chosen`, a
    /// starving waiter, and wakes it if it sleeps. Releases the guard.
    func handOff(to chosen: Waiter, _ guardLock: PlainFutexMutex) {
        unlink(chosen)
        // `held` stays 1: the lock passes to the chosen thread. Releasing:
        // the critical section just ended is published to it.
        let previous = AtomicMemory.exchange(Waiter.granted, at: chosen.state, ordering: .acquiringAndReleasing)
        guardLock.unlock()
        if previous == Waiter.sleeping {
            // After releasing the guard, so that the woken thread does not run
            // into it. The record lives on the chosen thread's stack, which it
            // may leave (woken spuriously, it sees `granted`) before this call
            // is made: the call then names a dead address. That is harmless:
            // FUTEX_WAKE on a private futex does not touch the memory, and at
            // worst it wakes whatever sleeps at that address later, which
            // futex(2) requires every sleeper to tolerate as a spurious
            // wake-up (all of Spindle's re-check their word).
            Futex(chosen.state).wake(1)
        }
    }

    /// Appends `me` to the list of waiters. Called holding the guard.
    func append(_ me: Waiter) {
        me.next = nil
        me.previous = lastWaiter.pointee
        if let last = lastWaiter.pointee {
            Waiter(base: last).next = me.base
        } else {
            firstWaiter.pointee = me.base
        }
        lastWaiter.pointee = me.base
    }

    /// Removes `node` from the list of waiters. Called holding the guard.
    func unlink(_ node: Waiter) {
        if let previous = node.previous {
            Waiter(base: previous).next = node.next
        } else {
            firstWaiter.pointee = node.next
        }
        if let next = node.next {
            Waiter(base: next).previous = node.previous
        } else {
            lastWaiter.pointee = node.previous
        }
    }
}
