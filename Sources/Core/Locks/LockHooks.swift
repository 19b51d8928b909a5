import CShims

/// The points where Spindle's locks tell the two stress-testing aids what
/// they do: ThreadSanitizer (mutex annotations, live only in a
/// `--sanitize=thread` build) and the lock-order checker (`LockOrder`, live
/// only when switched on). One call at each point of each lock kind:
///
///     willLock     before a blocking (or timed) acquisition: the checker
///                  looks for a cycle here, before the thread can wait
///     didTryLock   after a successful `tryLock`: the checker records the
///                  hold (a try never waits, so it closes no cycle)
///     lockFailed   a timed acquisition gave up: the checker forgets it
///     willUnlock   before a release: the checker forgets the hold
///     destroyed    a lock's storage ends: both forget its address
///
///     tsanAcquired / tsanReleasing / tsanCreated: the sanitizer's
///     annotations, made right after a lock is taken and right before it is
///     given back (see cshims_tsan.h). The futex cores make them
///     (`PlainFutexMutex`, `FutexMutex`), so every lock built on them and
///     every path that takes or releases one (a condition's wait, a fair
///     hand-off) is covered; locks with words of their own
///     (`ReadWriteLock`, `SpinLock`, `ConditionLock`) make them themselves.
///
/// Cost with both off: the TSan calls compile to nothing without the
/// sanitizer, and each checker hook is one relaxed load of a global flag
/// (`cshims_lock_order_flag`) and a branch predicted not taken. A blocking
/// `lock()` pays one load (`willLock`), an `unlock()` one (`willUnlock`).
@usableFromInline
enum LockHooks {
    /// What kind of hold a lock call asks for, and a name for reports.
    @usableFromInline
    struct Kind: Sendable {
        @usableFromInline let name: StaticString
        @usableFromInline let options: UInt8

        @inlinable init(_ name: StaticString, _ options: UInt8 = 0) {
            self.name = name
            self.options = options
        }

        /// A shared hold (a read lock): two shared holds never exclude
        /// each other.
        @inlinable static var shared: UInt8 { 1 }
        /// The same thread may take it again while it holds it.
        @inlinable static var recursive: UInt8 { 2 }

        /// Held by a task, not a thread (`AsyncLock`).
        @inlinable static var task: UInt8 { 4 }

        /// A shared hold that queues behind a waiting writer (a
        /// writer-preferring lock's read): it can wait for another shared
        /// hold of the same lock, through the writer between them.
        @inlinable static var queuesBehindWriters: UInt8 { 8 }

        @inlinable var isShared: Bool { options & Self.shared != 0 }
        /// A shared hold that never waits for another shared hold (lockdep's
        /// recursive reader): a writer-preferring lock's reads are not.
        @inlinable var neverWaitsForReaders: Bool {
            options & (Self.shared | Self.queuesBehindWriters) == Self.shared
        }
        @inlinable var isTaskHeld: Bool { options & Self.task != 0 }
        @inlinable var isRecursive: Bool { options & Self.recursive != 0 }

        @inlinable static var lock: Kind { Kind("Lock") }
        @inlinable static var recursiveLock: Kind { Kind("RecursiveLock", recursive) }
        @inlinable static var lockedValue: Kind { Kind("LockedValue") }
        @inlinable static var condition: Kind { Kind("Condition") }
        @inlinable static var conditionLock: Kind { Kind("ConditionLock") }
        @inlinable static var spinLock: Kind { Kind("SpinLock") }
        @inlinable static var readLock: Kind { Kind("ReadWriteLock", shared | queuesBehindWriters) }
        @inlinable static var writeLock: Kind { Kind("ReadWriteLock") }
        @inlinable static var synchronized: Kind { Kind("synchronized", recursive) }
        @inlinable static var asyncLock: Kind { Kind("AsyncLock", task) }
    }

    /// Whether the lock-order checker is on: one relaxed load.
    @inlinable
    static var isChecking: Bool { cshims_lock_order_on() != 0 }

    /// Before a blocking acquisition of the lock at `id`.
    @inlinable
    static func willLock(_ id: UnsafeRawPointer, _ kind: Kind) {
        if cshims_lock_order_on() != 0 { LockOrder.willAcquire(UInt(bitPattern: id), kind, object: nil) }
    }

    /// Before `synchronized(object)` takes the object's lock (recursive).
    @inlinable
    static func willLock(object: AnyObject) {
        if cshims_lock_order_on() != 0 { LockOrder.willAcquire(object: object) }
    }

    /// Before `synchronized(object)` gives one level of the object's lock back.
    @inlinable
    static func willUnlock(object: AnyObject) {
        if cshims_lock_order_on() != 0 { LockOrder.didRelease(object: object) }
    }

    /// After a `tryLock` of the lock at `id` succeeded.
    @inlinable
    static func didTryLock(_ id: UnsafeRawPointer, _ kind: Kind) {
        if cshims_lock_order_on() != 0 { LockOrder.didTryAcquire(UInt(bitPattern: id), kind) }
    }

    /// A timed acquisition (announced by `willLock`) gave up.
    @inlinable
    static func lockFailed(_ id: UnsafeRawPointer, _ kind: Kind) {
        if cshims_lock_order_on() != 0 { LockOrder.didRelease(UInt(bitPattern: id), kind) }
    }

    /// Before a release of the lock at `id`.
    @inlinable
    static func willUnlock(_ id: UnsafeRawPointer, _ kind: Kind) {
        if cshims_lock_order_on() != 0 { LockOrder.didRelease(UInt(bitPattern: id), kind) }
    }

    /// A lock's storage is going away: its address may be reused by a lock
    /// that has no history.
    @inlinable
    static func destroyed(_ id: UnsafeRawPointer) {
        cshims_tsan_mutex_destroy(UnsafeMutableRawPointer(mutating: id), 0)
        if cshims_lock_order_on() != 0 { LockOrder.forget(UInt(bitPattern: id)) }
    }

    // MARK: ThreadSanitizer

    /// A new lock at `word`: reports about it show this call's stack, which
    /// names the Spindle type whose initializer made it.
    @inlinable
    static func tsanCreated(_ word: UnsafeRawPointer, _ flags: UInt32 = 0) {
        cshims_tsan_mutex_create(UnsafeMutableRawPointer(mutating: word), flags)
    }

    /// Right after the lock at `word` was taken (`flags`: READ_LOCK for a
    /// shared hold, TRY_LOCK for a `tryLock`).
    @inlinable
    static func tsanAcquired(_ word: UnsafeRawPointer, _ flags: UInt32 = 0) {
        let address = UnsafeMutableRawPointer(mutating: word)
        cshims_tsan_mutex_pre_lock(address, flags)
        cshims_tsan_mutex_post_lock(address, flags)
    }

    /// Right before the lock at `word` is given back.
    @inlinable
    static func tsanReleasing(_ word: UnsafeRawPointer, _ flags: UInt32 = 0) {
        let address = UnsafeMutableRawPointer(mutating: word)
        cshims_tsan_mutex_pre_unlock(address, flags)
        cshims_tsan_mutex_post_unlock(address, flags)
    }

    /// Runs `signal`, a signal or broadcast of the condition at `address`,
    /// as one for ThreadSanitizer: its bookkeeping is not checked for races
    /// (it orders nothing by itself; the condition's lock does).
    @inlinable
    @inline(__always)
    static func tsanSignal(_ address: UnsafeRawPointer, _ signal: () -> Void) {
        let address = UnsafeMutableRawPointer(mutating: address)
        cshims_tsan_mutex_pre_signal(address, 0)
        signal()
        cshims_tsan_mutex_post_signal(address, 0)
    }

    @inlinable static var tsanTry: UInt32 { UInt32(CSHIMS_TSAN_MUTEX_TRY_LOCK) }
    @inlinable static var tsanRead: UInt32 { UInt32(CSHIMS_TSAN_MUTEX_READ_LOCK) }
    @inlinable static var tsanReentrant: UInt32 { UInt32(CSHIMS_TSAN_MUTEX_WRITE_REENTRANT) }
}
