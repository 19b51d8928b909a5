/// A count of unfinished work that callers can wait on, or be notified
/// about: the guide's dispatch group.
///
/// Replaces Dispatch's `DispatchGroup`.
///
/// `enter()` adds one, `leave()` takes one away; `async(group:_:)` on a
/// queue does both around an item. `wait` blocks until the count is zero
/// (one wait for every member at once, where thread joins would take one
/// after another); `notify(on:_:)` submits a closure to a queue once the
/// count is zero. Waiting on, or notifying about, an empty group completes
/// at once.
///
/// Thread-safe. Memory: everything a member wrote before its `leave()` is
/// visible to a waiter after `wait` returns and to a notification closure.
/// Misuse: `leave()` without a matching `enter()` stops the process with a
/// message (Dispatch on Linux dies of SIGILL without one), and so does a
/// count beyond 2^31 - 1.
///
/// A group with members keeps itself alive until the last one leaves (its
/// first `enter` retains it, the `leave` that empties it releases it), so
/// dropping every reference to a group with members leaves it to finish.
///
/// The count and a "someone sleeps" bit share one futex word: `leave` makes
/// a system call only when it empties the group while someone waits.
public final class WorkGroup: @unchecked Sendable {
    // @unchecked: the word is atomic; `notifications` synchronizes itself.

    private static let waitersBit: UInt32 = 1 << 31
    static let countMask: UInt32 = ~waitersBit

    /// The count word, then the notifications' lock word, in one line.
    private let word: UnsafeMutablePointer<UInt32>
    /// The count word, for the async wait.
    var countWord: UnsafeMutablePointer<UInt32> { word }
    private let notifications: PendingNotifications

    /// An empty group.
    public init() {
        word = allocateStableWords(byteCount: 8).assumingMemoryBound(to: UInt32.self)
        notifications = PendingNotifications(lockWord: word + 1)
    }

    deinit { deallocateStableWords(UnsafeMutableRawPointer(word)) }

    /// Members that have entered and not left (stale at once).
    public var count: Int { Int(AtomicMemory.load(from: word, ordering: .relaxed) & Self.countMask) }

    /// Adds one unfinished member. Never blocks.
    public func enter() {
        let now = AtomicMemory.add(1, to: word, ordering: .relaxed) & Self.countMask
        // The first member keeps the group alive for the members that hold
        // it unretained (`WorkUnit.grouped`); the leave that empties the
        // group releases it. A leave emptying it meanwhile released an
        // earlier retain, never this one: the caller's reference covers both.
        if now == 1 { _ = Unmanaged.passUnretained(self).retain() }
        if now == 0 {
            misuse("WorkGroup.enter(): more than \(Self.countMask) members at once")
        }
    }

    /// Marks one member finished; the last one wakes the waiters and submits
    /// the notifications. Never blocks (beyond a short internal lock).
    /// Releasing: pairs with the waiters' acquiring loads. Stops the process
    /// if the group is empty (a `leave` without its `enter`).
    public func leave() {
        let now = AtomicMemory.add(UInt32.max, to: word, ordering: .acquiringAndReleasing)
        let count = now & Self.countMask
        if count == Self.countMask {
            misuse("WorkGroup.leave(): the group is empty; leave() was called more times than enter()")
        }
        guard count == 0 else { return }
        if now & Self.waitersBit != 0 {
            _ = AtomicMemory.and(Self.countMask, into: word, ordering: .relaxed)
            Futex(word).wakeAll()
        }
        notifications.fire()
        // The first member's retain (see `enter`); may free the group, so
        // nothing touches `self` after it.
        Unmanaged.passUnretained(self).release()
    }

    /// Blocks until the group is empty. A blocking region on a pool worker.
    /// Acquiring: sees everything the members wrote.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait() {
        _ = wait(until: .distantFuture)
    }

    /// Blocks until the group is empty or `deadline` passes; a deadline
    /// already past only checks.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(until deadline: MonotonicClock.Instant) -> WaitResult {
        CompletionWaiters(word: word, waitersBit: Self.waitersBit).wait(until: deadline) {
            $0 & Self.countMask == 0
        }
    }

    /// Blocks until the group is empty or `timeout` has passed.
    @available(*, noasync, message: "blocks the thread; in async code use `await wait()`")
    public func wait(timeout: Duration) -> WaitResult {
        wait(until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Submits `body` to `queue` once the group is empty: at once if it is
    /// empty now, else when the last member leaves. Never blocks.
    public func notify(on queue: WorkQueue, _ body: @escaping @Sendable () -> Void) {
        // Acquiring: the closure sees what the members wrote.
        notifications.add(body, on: queue) {
            AtomicMemory.load(from: word, ordering: .acquiring) & Self.countMask == 0
        }
    }
}
