/// A counting semaphore with the dispatch-semaphore model: Spindle's
/// `DispatchSemaphore`, and POSIX's `sem_t` between threads of one process.
///
/// ```swift
/// let slots = Semaphore(value: 4)                // at most four copies at a time
/// var copies: [SpawnedThread<Void>] = []
/// for file in files {
///     slots.wait()                               // blocks while four are running
///     copies.append(try NativeThread.start {
///         defer { slots.signal() }
///         print("copying", file)
///     })
/// }
/// for copy in copies { try copy.join() }
/// ```
///
/// The semaphore counts available resources. `wait()` takes one, sleeping
/// while none is available; `signal()` returns one, waking a waiter if any
/// thread waits. As in the Concurrency Programming Guide's description of
/// dispatch semaphores, the kernel is involved only when a thread must sleep:
///
/// - `wait()` with a resource available, and `signal()` with nobody waiting,
///   are one atomic add each, inlined into the caller.
/// - A waiter that finds none spins for a wake-up before it sleeps
///   (`futex(FUTEX_WAIT_BITSET)`), up to 13 µs and only as long as spinning
///   has been paying off on this semaphore (`AdaptiveSpin`); `signal()` makes
///   a system call only when a waiter is actually asleep.
///
/// The count may go negative: then its magnitude is the number of threads
/// waiting. Each `signal()` that finds it negative hands one wake-up token to
/// the waiters; tokens are not tied to a particular waiter, so who wakes first
/// is not specified (the kernel wakes its sleepers in arrival order).
///
/// `Semaphore` is a handle: copies share one semaphore. The words live in a
/// 64-byte heap block that never moves.
///
/// Memory: a `signal()` releases and the `wait()` it satisfies acquires, so
/// what the signalling thread wrote before `signal()` is visible to the
/// thread whose `wait()` returns because of it.
///
/// Misuse: creating a semaphore with a negative value stops the process with
/// a message. Signalling more often than waiting simply raises the count (as
/// `DispatchSemaphore` does, minus its deallocation check), up to `Int.max`;
/// a `signal()` beyond that stops the process with a message.
public struct Semaphore: @unchecked Sendable {
    // @unchecked: the storage is only touched through atomics and the kernel.

    /// The semaphore's words, laid out by this struct (read through
    /// `MemoryLayout.offset(of:)`, never by hand-written offsets).
    @usableFromInline
    struct Words {
        /// Resources available, or minus the number of waiters.
        @usableFromInline var count: Int
        /// Wake-up tokens: the futex word sleepers wait on.
        @usableFromInline var tokens: UInt32
        /// How many threads may be asleep.
        @usableFromInline var sleepers: UInt32
        /// The waiters' spin limit (`AdaptiveSpin`).
        @usableFromInline var spin: UInt32
        /// Tasks suspended in `await wait()` (their continuations are in
        /// `Storage.suspended`); `signal()` hands them tokens when non-zero.
        @usableFromInline var suspendedCount: UInt32
        /// The plain mutex word guarding `Storage.suspended`.
        @usableFromInline var suspendedGuard: UInt32
        /// The last number given to a suspending task (atomic), by which
        /// its cancellation handler finds it in `Storage.suspended`.
        @usableFromInline var lastWaiter: Int
    }

    /// Owns the words (`Words`), in a heap block that never moves.
    @usableFromInline
    final class Storage {
        @usableFromInline let base: UnsafeMutableRawPointer
        /// Tasks suspended in `await wait()`, oldest first, each with the
        /// number its cancellation handler finds it by (`Words.lastWaiter`);
        /// the continuation is resumed with true when the task took a
        /// resource, false when it left the line because it was cancelled.
        /// Guarded by the `suspendedGuard` word.
        var suspended: [(id: Int, continuation: UnsafeContinuation<Bool, Never>)] = []
        init(value: Int) {
            base = allocateStableWords(byteCount: MemoryLayout<Words>.size)
            (base + MemoryLayout<Words>.offset(of: \.count)!).storeBytes(of: value, as: Int.self)
            (base + MemoryLayout<Words>.offset(of: \.spin)!).storeBytes(of: AdaptiveSpin.initialPolls, as: UInt32.self)
        }
        deinit {
            LockNames.forget(base)
            deallocateStableWords(base)
        }
    }

    @usableFromInline let storage: Storage

    /// A name for the semaphore, for people reading diagnostics (as Foundation's
    /// `NSLock.name`; Foundation has no named semaphore): shown in `description` and in the message with which
    /// misuse stops the process. `nil` (the default) for none. Settable on
    /// any copy of the handle, from any thread; every copy sees it.
    ///
    /// Kept in a side table, not in the semaphore (see `LockNames` in the
    /// sources): an unnamed semaphore is no bigger and `wait()`/`signal()` never reads
    /// the name. Reading or setting it takes that table's lock (it blocks
    /// only for another name's read or write) and orders nothing else.
    public var name: String? {
        get { LockNames.name(at: storage.base) }
        nonmutating set { LockNames.setName(newValue, at: storage.base) }
    }

    /// A semaphore with `value` resources available (0 makes it a signal
    /// between threads: the first `wait()` sleeps until a `signal()`). Stops
    /// the process with a message if `value` is negative.
    public init(value: Int) {
        require(
            value >= 0,
            "Semaphore(value:): `value` is \(value); a semaphore starts with zero or more resources")
        storage = Storage(value: value)
    }

    /// The word `field` of `Words`.
    @inlinable
    func word<T>(_ field: KeyPath<Words, T>) -> UnsafeMutablePointer<T> {
        (storage.base + MemoryLayout<Words>.offset(of: field)!).assumingMemoryBound(to: T.self)
    }

    @inlinable
    var count: UnsafeMutablePointer<Int> { word(\.count) }

    @inlinable
    var tokens: UnsafeMutablePointer<UInt32> { word(\.tokens) }

    @inlinable
    var sleepers: UnsafeMutablePointer<UInt32> { word(\.sleepers) }

    @inlinable
    var spin: AdaptiveSpin { AdaptiveSpin(word(\.spin)) }

    /// The count now: available resources if positive, minus the number of
    /// waiting threads if negative. A snapshot, for tests and diagnostics.
    public var value: Int { AtomicMemory.load(from: count, ordering: .relaxed) }

    // MARK: Waiting

    /// Takes a resource, sleeping until one is available. Blocks. Acquire
    /// ordering (pairs with the `signal()` that provided the resource).
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait() {
        Perturbation.point(.semaphoreWait)
        // Acquiring: pairs with the releasing add in `signal`.
        if AtomicMemory.decrement(count, ordering: .acquiring) >= 0 { return }
        _ = waitContended(until: .distantFuture)
    }

    /// Takes a resource, sleeping at most until `deadline` on the monotonic
    /// clock: `.completed` if it took one, `.timedOut` if the deadline passed
    /// first (see `WaitResult`). Blocks. Acquire ordering on success.
    /// `.distantFuture` waits forever; a deadline already past returns at
    /// once (`.completed` only if a resource was available).
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(until deadline: MonotonicClock.Instant) -> WaitResult {
        Perturbation.point(.semaphoreWait)
        if AtomicMemory.decrement(count, ordering: .acquiring) >= 0 { return .completed }
        return waitContended(until: deadline) ? .completed : .timedOut
    }

    /// As `wait(until:)`, with a deadline `timeout` from now.
    @inlinable
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(timeout: Duration) -> WaitResult {
        wait(until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Takes a resource if one is available now. Never blocks, never joins
    /// the waiters. Acquire ordering on success.
    @inlinable
    public func tryWait() -> Bool {
        Perturbation.point(.semaphoreWait)
        var current = AtomicMemory.load(from: count, ordering: .relaxed)
        while current > 0 {
            let r = AtomicMemory.compareExchange(
                expected: current, desired: current - 1, at: count, ordering: .acquiring)
            if r.exchanged { return true }
            current = r.original
        }
        return false
    }

    /// The caller has counted itself among the waiters (the count it left is
    /// negative): wait for a token, or withdraw at the deadline.
    @usableFromInline
    @inline(never)
    func waitContended(until deadline: MonotonicClock.Instant) -> Bool {
        var deadline = deadline
        if !isPast(deadline) && spin.poll({ AtomicMemory.load(from: tokens, ordering: .relaxed) != 0 }) {
            if takeToken() { return true }
        }
        AtomicMemory.increment(sleepers, ordering: .sequentiallyConsistent)
        defer { AtomicMemory.decrement(sleepers, ordering: .relaxed) }
        let futex = Futex(tokens)
        while true {
            // Sequentially consistent with `signal`'s token increment and
            // sleeper check: either it sees us counted and wakes us, or we
            // see its token here.
            if takeToken() { return true }
            if isPast(deadline) {
                if withdraw() { return false }
                // A signal has counted us already: its token is on its way.
                deadline = .distantFuture
                continue
            }
            _ = announcingBlocking { futex.wait(expecting: 0, until: deadline) }
        }
    }

    @usableFromInline
    func isPast(_ deadline: MonotonicClock.Instant) -> Bool {
        !deadline.isDistantFuture && MonotonicClock.now >= deadline
    }

    /// Takes one wake-up token if there is one.
    @usableFromInline
    func takeToken() -> Bool {
        var current = AtomicMemory.load(from: tokens, ordering: .sequentiallyConsistent)
        while current != 0 {
            // Acquiring: pairs with the token's releasing increment in
            // `signalWaiting`, and through it with the signaller's writes.
            let r = AtomicMemory.compareExchange(
                expected: current, desired: current - 1, at: tokens, ordering: .acquiring)
            if r.exchanged { return true }
            current = r.original
        }
        return false
    }

    /// Leaves the line of waiters if no signal has counted this thread yet
    /// (the count is still negative); returns whether it left.
    @usableFromInline
    func withdraw() -> Bool {
        var current = AtomicMemory.load(from: count, ordering: .relaxed)
        while current < 0 {
            let r = AtomicMemory.compareExchange(
                expected: current, desired: current + 1, at: count, ordering: .relaxed)
            if r.exchanged { return true }
            current = r.original
        }
        return false
    }

    // MARK: Signalling

    /// Returns a resource. If threads are waiting, hands one of them a
    /// wake-up and returns true; otherwise returns false. Never blocks; one
    /// atomic add, plus a system call only when a waiter is asleep. Release
    /// ordering. Stops the process with a message if the count is `Int.max`
    /// (it would overflow).
    @inlinable
    @discardableResult
    public func signal() -> Bool {
        Perturbation.point(.semaphoreSignal)
        // Releasing: pairs with the acquiring decrement in `wait`.
        let newCount = AtomicMemory.increment(count, ordering: .releasing)
        if newCount > 0 { return false }
        signalWaiting(newCount: newCount)
        return true
    }

    /// The count `signal()` left is not positive: a waiter is counted, or the
    /// count wrapped from `Int.max` (never reached by waiters, who can only
    /// take it down to minus their number).
    @usableFromInline
    @inline(never)
    func signalWaiting(newCount: Int) {
        if newCount == Int.min {
            misuse("\(LockNames.label("Semaphore", storage.base)).signal(): the count overflowed (it was Int.max); more signals than any program can wait for")
        }
        AtomicMemory.increment(tokens, ordering: .sequentiallyConsistent)
        // The other half of the Dekker pair in `wait() async`: a task that
        // counted itself suspended before this token was added is seen here.
        if AtomicMemory.load(from: word(\.suspendedCount), ordering: .sequentiallyConsistent) != 0 {
            resumeSuspended()
        }
        if AtomicMemory.load(from: sleepers, ordering: .sequentiallyConsistent) != 0 {
            Futex(tokens).wake(1)
        }
    }

    /// Hands available tokens to suspended tasks, oldest first.
    @usableFromInline
    func resumeSuspended() {
        let guardWord = PlainFutexMutex(word: word(\.suspendedGuard))
        var ready: [UnsafeContinuation<Bool, Never>] = []
        guardWord.lock()
        while !storage.suspended.isEmpty && takeToken() {
            ready.append(storage.suspended.removeFirst().continuation)
            AtomicMemory.add(UInt32.max, to: word(\.suspendedCount), ordering: .sequentiallyConsistent)
        }
        guardWord.unlock()
        for continuation in ready { continuation.resumeOutsideTSan(returning: true) }
    }

    /// Takes a resource, suspending the calling task (not blocking its
    /// thread) until one is available. A resource available now is taken
    /// with one atomic add, as in `wait()`; otherwise the task waits in line
    /// with the blocking waiters and a `signal()` resumes it. Acquire
    /// ordering, as `wait()`.
    ///
    /// Cancellation: a task that is cancelled while it waits (or was
    /// cancelled before it had to wait) leaves the line and the call throws
    /// `CancellationError`, having taken nothing. A task that finds a
    /// resource available takes it whether cancelled or not, and so does
    /// one whose cancellation comes after a `signal()` had already counted
    /// it (the resource was handed over; the call then returns normally).
    public func wait() async throws(CancellationError) {
        // Acquiring: pairs with the releasing increment in `signal`.
        if AtomicMemory.decrement(count, ordering: .acquiring) >= 0 { return }
        // Counted as a waiter: a signal will add a token for us, unless we
        // withdraw first.
        if await !waitSuspended() { throw CancellationError() }
        // Acquiring: pairs with the releasing increment of the `signal`
        // that handed the token over. The resume carries that edge too, but
        // not to ThreadSanitizer when it came before the task suspended (an
        // atomic of the Swift runtime's it does not see).
        _ = AtomicMemory.load(from: count, ordering: .acquiring)
    }

    /// The task is counted among the waiters: suspends until a token is
    /// handed to it (true) or it withdrew because it was cancelled (false).
    private func waitSuspended() async -> Bool {
        // Numbered before suspending, so that the cancellation handler knows
        // what to look for without a box shared with the operation.
        let id = AtomicMemory.add(1, to: word(\.lastWaiter), ordering: .relaxed)
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Bool, Never>) in
                let guardWord = PlainFutexMutex(word: word(\.suspendedGuard))
                guardWord.lock()
                AtomicMemory.add(1, to: word(\.suspendedCount), ordering: .sequentiallyConsistent)
                if takeToken() {
                    AtomicMemory.add(UInt32.max, to: word(\.suspendedCount), ordering: .sequentiallyConsistent)
                    guardWord.unlock()
                    continuation.resume(returning: true)
                    return
                }
                // The cancellation flag is set before the handler runs, and
                // the handler takes this guard: either it finds the entry
                // below, or this check sees the flag.
                if Task.isCancelled && withdraw() {
                    AtomicMemory.add(UInt32.max, to: word(\.suspendedCount), ordering: .sequentiallyConsistent)
                    guardWord.unlock()
                    continuation.resume(returning: false)
                    return
                }
                storage.suspended.append((id, continuation))
                guardWord.unlock()
            }
        } onCancel: {
            leaveLine(id)
        }
    }

    /// A suspended task's cancellation: if it is still in line and no
    /// signal has counted it yet, it leaves the line and is resumed with
    /// false. Counted already, it stays: the signal's token reaches it. Not
    /// in line yet (the task has not taken the guard), it sees the
    /// cancellation itself when it gets there.
    private func leaveLine(_ id: Int) {
        let guardWord = PlainFutexMutex(word: word(\.suspendedGuard))
        guardWord.lock()
        guard let index = storage.suspended.firstIndex(where: { $0.id == id }), withdraw() else {
            guardWord.unlock()
            return
        }
        let continuation = storage.suspended.remove(at: index).continuation
        AtomicMemory.add(UInt32.max, to: word(\.suspendedCount), ordering: .sequentiallyConsistent)
        guardWord.unlock()
        continuation.resumeOutsideTSan(returning: false)
    }
}

extension Semaphore: Equatable {
    /// Two handles are equal when they are the same semaphore.
    public static func == (a: Semaphore, b: Semaphore) -> Bool { a.storage === b.storage }
}
