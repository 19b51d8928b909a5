import CShims

/// A shared/exclusive lock that prefers writers, as the guide describes:
/// any number of readers may hold it together; a writer holds it alone; and
/// while a writer waits, new readers wait too, so a stream of readers cannot
/// starve a writer.
///
/// Replaces pthread's `pthread_rwlock_t`.
///
/// Readers enter and leave with one atomic read-modify-write each (no system
/// call while no one waits). Waiting readers sleep on the state word; waiting
/// writers sleep on a second word, so a writer's unlock can wake one writer
/// without waking every reader.
///
/// Memory: a read or write acquisition acquires, a read or write unlock
/// releases; writes made under the write lock are visible to every later
/// reader and writer. Misuse: unlocking the wrong mode (or an unlocked lock)
/// stops the process with a message. Not recursive: a reader that takes the
/// read lock again while a writer waits deadlocks (the writer waits for it,
/// it waits behind the writer). `ReadWriteLock` is a handle: copies share
/// one lock. Its `Locking` conformance is the write lock.
public struct ReadWriteLock: Locking, @unchecked Sendable {
    // @unchecked: both words are only accessed atomically.

    /// The state word.
    ///
    ///     bits 0–29  readers holding the lock; all ones (`writeLocked`) = a writer holds it
    ///     bit 30     readers are (or may be) asleep on the state word
    ///     bit 31     writers are (or may be) asleep on `writerWake`
    @usableFromInline static var mask: UInt32 { 0x3FFF_FFFF }
    @usableFromInline static var writeLocked: UInt32 { mask }
    @usableFromInline static var maxReaders: UInt32 { mask - 1 }
    @usableFromInline static var readersWaiting: UInt32 { 1 << 30 }
    @usableFromInline static var writersWaiting: UInt32 { 1 << 31 }

    @usableFromInline
    final class Storage: ManagedBuffer<Void, UInt32> {
        deinit { withUnsafeMutablePointerToElements { LockHooks.destroyed($0) } }
    }
    // Three tail words: [0] the state, [1] the writers' wake-up counter,
    // [2] how many writers are in the slow path waiting.

    @usableFromInline let storage: Storage
    @usableFromInline let state: UnsafeMutablePointer<UInt32>
    /// Bumped before every writer wake-up, so a writer about to sleep can
    /// tell that a wake-up raced with it.
    @usableFromInline let writerWake: UnsafeMutablePointer<UInt32>
    /// Writers waiting in the slow path; the last one to give up clears
    /// `writersWaiting` so readers are not left queued behind nobody.
    @usableFromInline let waitingWriters: UnsafeMutablePointer<UInt32>

    /// A new, unlocked read-write lock.
    public init() {
        let buffer = Storage.create(minimumCapacity: 3) { _ in }
        storage = unsafeDowncast(buffer, to: Storage.self)
        state = storage.withUnsafeMutablePointerToElements { $0 }
        state.initialize(repeating: 0, count: 3)
        writerWake = state + 1
        waitingWriters = state + 2
        LockHooks.tsanCreated(state)
    }

    /// The raw state word, for tests and diagnostics: 0 when idle.
    package var wordValue: UInt32 { AtomicMemory.load(from: state, ordering: .relaxed) }

    @inlinable
    static func isReadLockable(_ s: UInt32) -> Bool {
        // Free or read-held, below the reader limit, and nobody waiting: a
        // waiting writer must get in first, and waiting readers are queued
        // behind one.
        s & mask < maxReaders && s & (readersWaiting | writersWaiting) == 0
    }

    // MARK: Read side

    /// Acquires the lock for reading; blocks while a writer holds it or waits.
    @inlinable
    public func readLock() {
        Perturbation.point(.lockAcquire)
        LockHooks.willLock(state, .readLock)
        let s = AtomicMemory.load(from: state, ordering: .relaxed)
        if !(Self.isReadLockable(s)
            && AtomicMemory.compareAndSwap(expected: s, desired: s + 1, at: state, ordering: .acquiring))
        {
            _ = readLockContended(deadline: .distantFuture)
        }
        LockHooks.tsanAcquired(state, LockHooks.tsanRead)
    }

    /// Acquires the lock for reading if possible without blocking.
    @inlinable
    public func tryReadLock() -> Bool {
        Perturbation.point(.lockAcquire)
        guard tryReadAcquire() else { return false }
        LockHooks.tsanAcquired(state, LockHooks.tsanRead | LockHooks.tsanTry)
        LockHooks.didTryLock(state, .readLock)
        return true
    }

    /// `tryReadLock` without the hooks (see `LockHooks`).
    @inlinable
    func tryReadAcquire() -> Bool {
        var s = AtomicMemory.load(from: state, ordering: .relaxed)
        while Self.isReadLockable(s) {
            let r = AtomicMemory.compareExchange(expected: s, desired: s + 1, at: state, ordering: .acquiring)
            if r.exchanged { return true }
            s = r.original
        }
        return false
    }

    /// Acquires the lock for reading, blocking at most until `deadline`.
    @inlinable
    public func readLock(before deadline: MonotonicClock.Instant) -> Bool {
        LockHooks.willLock(state, .readLock)
        guard tryReadAcquire() || readLockContended(deadline: deadline) else {
            LockHooks.lockFailed(state, .readLock)
            return false
        }
        LockHooks.tsanAcquired(state, LockHooks.tsanRead)
        return true
    }

    /// Acquires the lock for reading, blocking at most `timeout`.
    @inlinable
    public func readLock(timeout: Duration) -> Bool {
        readLock(before: MonotonicClock.now.advanced(by: timeout))
    }

    /// Releases a read lock. Never blocks; the last reader out wakes a
    /// waiting writer. Releasing.
    @inlinable
    public func readUnlock() {
        LockHooks.willUnlock(state, .readLock)
        LockHooks.tsanReleasing(state, LockHooks.tsanRead)
        let s = AtomicMemory.add(UInt32.max, to: state, ordering: .releasing)  // minus one
        // Checked after the fact: a wrapped count means there was no reader.
        require(
            (s &+ 1) & Self.mask != 0 && (s &+ 1) & Self.mask != Self.writeLocked,
            "ReadWriteLock.readUnlock(): the lock is not read-locked")
        if s & Self.mask == 0 && s & Self.writersWaiting != 0 {
            wakeWriterOrReaders(s)
        }
        Perturbation.point(.lockRelease)
    }

    /// Runs `body` holding the read lock, releasing it on every path.
    @inlinable
    public func withReadLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        readLock()
        defer { readUnlock() }
        return try body()
    }

    // MARK: Write side

    /// Acquires the lock for writing; blocks while anyone holds it.
    @inlinable
    public func writeLock() {
        Perturbation.point(.lockAcquire)
        LockHooks.willLock(state, .writeLock)
        if !AtomicMemory.compareAndSwap(expected: 0, desired: Self.writeLocked, at: state, ordering: .acquiring) {
            _ = writeLockContended(deadline: .distantFuture)
        }
        LockHooks.tsanAcquired(state)
    }

    /// Acquires the lock for writing if nobody holds it. Never blocks.
    @inlinable
    public func tryWriteLock() -> Bool {
        Perturbation.point(.lockAcquire)
        guard tryWriteAcquire() else { return false }
        LockHooks.tsanAcquired(state, LockHooks.tsanTry)
        LockHooks.didTryLock(state, .writeLock)
        return true
    }

    /// `tryWriteLock` without the hooks (see `LockHooks`).
    @inlinable
    func tryWriteAcquire() -> Bool {
        var s = AtomicMemory.load(from: state, ordering: .relaxed)
        while s & Self.mask == 0 {
            let r = AtomicMemory.compareExchange(expected: s, desired: s | Self.writeLocked, at: state, ordering: .acquiring)
            if r.exchanged { return true }
            s = r.original
        }
        return false
    }

    /// Acquires the lock for writing, blocking at most until `deadline`.
    @inlinable
    public func writeLock(before deadline: MonotonicClock.Instant) -> Bool {
        LockHooks.willLock(state, .writeLock)
        guard tryWriteAcquire() || writeLockContended(deadline: deadline) else {
            LockHooks.lockFailed(state, .writeLock)
            return false
        }
        LockHooks.tsanAcquired(state)
        return true
    }

    /// Acquires the lock for writing, blocking at most `timeout`.
    @inlinable
    public func writeLock(timeout: Duration) -> Bool {
        writeLock(before: MonotonicClock.now.advanced(by: timeout))
    }

    /// Releases the write lock, waking one waiting writer, or else every
    /// waiting reader. Never blocks. Releasing.
    @inlinable
    public func writeUnlock() {
        LockHooks.willUnlock(state, .writeLock)
        LockHooks.tsanReleasing(state)
        let s = AtomicMemory.add(0 &- Self.writeLocked, to: state, ordering: .releasing)
        require(
            (s &+ Self.writeLocked) & Self.mask == Self.writeLocked,
            "ReadWriteLock.writeUnlock(): the lock is not write-locked")
        if s != 0 { wakeWriterOrReaders(s) }
        Perturbation.point(.lockRelease)
    }

    /// Runs `body` holding the write lock, releasing it on every path.
    @inlinable
    public func withWriteLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        writeLock()
        defer { writeUnlock() }
        return try body()
    }

    // MARK: Locking (the write lock)
    // `lock`/`unlock`/`tryLock`/`lock(before:)` are the write lock's
    // `writeLock`/`writeUnlock`/`tryWriteLock`/`writeLock(before:)`: same
    // blocking, ordering and misuse behaviour.

    @inlinable public func lock() { writeLock() }
    @inlinable public func unlock() { writeUnlock() }
    @inlinable public func tryLock() -> Bool { tryWriteLock() }
    @inlinable public func lock(before deadline: MonotonicClock.Instant) -> Bool { writeLock(before: deadline) }
}

// MARK: - Slow paths

extension ReadWriteLock {
    /// Rounds of spinning before sleeping, while the lock is held with
    /// nobody asleep (the holder is likely running and about to leave).
    @usableFromInline static var spinLimit: Int { 8 }

    @usableFromInline
    @inline(never)
    func readLockContended(deadline: MonotonicClock.Instant) -> Bool {
        // A deadline already past: the caller's try form has failed; no
        // spin and no waiting flag (which would cost an unlock a wake call).
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return false }
        let futex = Futex(state)
        var spins = 0
        var s = AtomicMemory.load(from: state, ordering: .relaxed)
        while true {
            if Self.isReadLockable(s) {
                let r = AtomicMemory.compareExchange(expected: s, desired: s + 1, at: state, ordering: .acquiring)
                if r.exchanged { return true }
                s = r.original
                continue
            }
            require(s & Self.mask != Self.maxReaders, "ReadWriteLock.readLock(): more than \(Self.maxReaders) readers")
            if s & (Self.readersWaiting | Self.writersWaiting) == 0 && spins < Self.spinLimit {
                for _ in 0..<(1 << spins) { spinLoopHint() }
                spins += 1
                s = AtomicMemory.load(from: state, ordering: .relaxed)
                continue
            }
            // The lock is free of holders but flags say someone waits: the
            // waker will let us in shortly; do not sleep on a free lock with
            // nobody left to wake us.
            if s & Self.mask == 0 && s & Self.writersWaiting == 0 && s & Self.readersWaiting != 0 {
                // Only readers wait and nobody holds it: clear the flag and go.
                let r = AtomicMemory.compareExchange(expected: s, desired: 1, at: state, ordering: .acquiring)
                if r.exchanged { futex.wakeAll(); return true }
                s = r.original
                continue
            }
            if s & Self.readersWaiting == 0 {
                let r = AtomicMemory.compareExchange(expected: s, desired: s | Self.readersWaiting, at: state, ordering: .relaxed)
                if !r.exchanged { s = r.original; continue }
                s |= Self.readersWaiting
            }
            if MonotonicClock.now >= deadline { return false }
            _ = futex.wait(expecting: s, until: deadline)
            s = AtomicMemory.load(from: state, ordering: .relaxed)
        }
    }

    @usableFromInline
    @inline(never)
    func writeLockContended(deadline: MonotonicClock.Instant) -> Bool {
        // A deadline already past: the caller's try form has failed; no
        // spin and no waiting flag (which would cost an unlock a wake call).
        if !deadline.isDistantFuture && MonotonicClock.now >= deadline { return false }
        var spins = 0
        var registered = false
        var s = AtomicMemory.load(from: state, ordering: .relaxed)
        while true {
            if s & Self.mask == 0 {
                // Keep `writersWaiting` set while other writers still wait,
                // so this writer's unlock looks for them.
                let others = AtomicMemory.load(from: waitingWriters, ordering: .sequentiallyConsistent) > (registered ? 1 : 0)
                let desired = (s & ~Self.writersWaiting) | Self.writeLocked | (others ? Self.writersWaiting : 0)
                let r = AtomicMemory.compareExchange(expected: s, desired: desired, at: state, ordering: .acquiring)
                if r.exchanged {
                    if registered { AtomicMemory.decrement(waitingWriters, ordering: .sequentiallyConsistent) }
                    return true
                }
                s = r.original
                continue
            }
            if s & (Self.readersWaiting | Self.writersWaiting) == 0 && spins < Self.spinLimit {
                for _ in 0..<(1 << spins) { spinLoopHint() }
                spins += 1
                s = AtomicMemory.load(from: state, ordering: .relaxed)
                continue
            }
            if !registered {
                AtomicMemory.increment(waitingWriters, ordering: .sequentiallyConsistent)
                registered = true
            }
            if s & Self.writersWaiting == 0 {
                let r = AtomicMemory.compareExchange(expected: s, desired: s | Self.writersWaiting, at: state, ordering: .relaxed)
                if !r.exchanged { s = r.original; continue }
            }
            // Read the wake counter, then re-check the state: an unlock (or a
            // writer giving up) after the check bumps the counter, so the
            // wait below returns at once instead of missing it.
            let seen = AtomicMemory.load(from: writerWake, ordering: .acquiring)
            s = AtomicMemory.load(from: state, ordering: .relaxed)
            if s & Self.mask == 0 || s & Self.writersWaiting == 0 { continue }
            if MonotonicClock.now >= deadline {
                giveUpWriting()
                return false
            }
            let result = Futex(writerWake).wait(expecting: seen, until: deadline)
            s = AtomicMemory.load(from: state, ordering: .relaxed)
            if result == .timedOut && s & Self.mask != 0 {
                giveUpWriting()
                return false
            }
        }
    }

    /// A registered writer stops waiting. The last one out clears
    /// `writersWaiting` (nobody is left for readers to defer to), nudges any
    /// writer that registered meanwhile so it sets the flag again, and lets
    /// in the readers that queued behind the flag.
    @usableFromInline
    func giveUpWriting() {
        guard AtomicMemory.decrement(waitingWriters, ordering: .sequentiallyConsistent) == 0 else { return }
        var s = AtomicMemory.load(from: state, ordering: .relaxed)
        while s & Self.writersWaiting != 0 {
            let r = AtomicMemory.compareExchange(expected: s, desired: s & ~Self.writersWaiting, at: state, ordering: .relaxed)
            if r.exchanged { s &= ~Self.writersWaiting; break }
            s = r.original
        }
        AtomicMemory.add(1, to: writerWake, ordering: .releasing)
        Futex(writerWake).wakeAll()
        while s & Self.readersWaiting != 0 && s & Self.mask != Self.writeLocked {
            let r = AtomicMemory.compareExchange(expected: s, desired: s & ~Self.readersWaiting, at: state, ordering: .relaxed)
            if r.exchanged { Futex(state).wakeAll(); break }
            s = r.original
        }
    }

    /// Called with the lock free of holders and some waiting flag set: wake
    /// one writer if a writer waits, else every reader.
    ///
    /// `writersWaiting` stays set while a woken writer is on its way, so new
    /// readers keep deferring to it; the writer recomputes the flag from
    /// `waitingWriters` when it takes the lock.
    @usableFromInline
    @inline(never)
    func wakeWriterOrReaders(_ observed: UInt32) {
        var s = observed
        if s & Self.writersWaiting != 0 {
            AtomicMemory.add(1, to: writerWake, ordering: .releasing)
            if Futex(writerWake).wake(1) > 0 { return }
            // None asleep. A registered writer between its check and its
            // sleep sees the counter move and comes in; leave it the flag.
            if AtomicMemory.load(from: waitingWriters, ordering: .sequentiallyConsistent) > 0 { return }
            // A stale flag (its writer gave up): clear it, nudge any writer
            // that registered meanwhile so it sets the flag again, and let
            // the readers go.
            while s & Self.writersWaiting != 0 {
                let r = AtomicMemory.compareExchange(expected: s, desired: s & ~Self.writersWaiting, at: state, ordering: .relaxed)
                if r.exchanged { s &= ~Self.writersWaiting; break }
                s = r.original
            }
            AtomicMemory.add(1, to: writerWake, ordering: .releasing)
            Futex(writerWake).wakeAll()
        }
        while s & Self.readersWaiting != 0 && s & Self.mask != Self.writeLocked {
            let r = AtomicMemory.compareExchange(expected: s, desired: s & ~Self.readersWaiting, at: state, ordering: .relaxed)
            if r.exchanged { Futex(state).wakeAll(); return }
            s = r.original
        }
    }
}
