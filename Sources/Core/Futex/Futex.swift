import CShims

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A 32-bit word that threads can sleep on and be woken through: Linux
/// `futex(2)`, the primitive under every blocking Spindle type.
///
/// `Futex` is a view of a word the caller owns; it does not allocate. The word
/// must stay at one address while anyone may wait on it (a class-owned
/// allocation, never a field of a Swift value that can move) and must be read
/// and written only atomically (`AtomicMemory`). The kernel compares it with
/// the value a waiter expects under its own lock, which is what makes a
/// check-then-sleep free of lost wake-ups: a waker that changes the word and
/// then calls `wake` cannot slip in between the waiter's check and its sleep.
///
/// Private futexes (the default) are faster and only work between threads of
/// one process. A word in memory shared between processes (a shared `mmap`)
/// needs `processShared: true` on both the waiting and the waking side.
public struct Futex: @unchecked Sendable {
    // @unchecked: a Futex is an address plus a flag; the word it points to is
    // only accessed through atomics and the kernel, from any thread.

    /// The word's address.
    public let word: UnsafeMutablePointer<UInt32>
    /// Whether waits and wakes use the process-shared (non-private) futex calls.
    public let isProcessShared: Bool

    /// A view of `word`. The address must be 4-byte aligned (the kernel
    /// refuses anything else; this stops the process with a message instead).
    @inlinable
    public init(_ word: UnsafeMutablePointer<UInt32>, processShared: Bool = false) {
        require(
            Int(bitPattern: word) & 3 == 0,
            "Futex.init: `word` \(word) is not 4-byte aligned")
        self.word = word
        self.isProcessShared = processShared
    }

    /// How a wait ended.
    public enum WaitResult: Sendable, Hashable {
        /// A `wake` call woke the thread, or the kernel woke it spuriously:
        /// check the word again before relying on it.
        case woken
        /// The deadline passed first (immediately, if it was already past).
        case timedOut
        /// The word did not hold the expected value when the kernel looked, so
        /// the thread did not sleep at all.
        case valueChanged
    }

    /// Sleeps while the word holds `expected`, until a `wake`, the deadline,
    /// or a spurious wake-up. Blocks the calling thread. A signal arriving
    /// during the sleep is absorbed: the wait resumes with the same absolute
    /// deadline (EINTR is retried). `nil` and `.distantFuture` wait forever.
    ///
    /// Memory: the kernel's check of the word is a plain load; a waiter that
    /// needs to see data written before the waker's store must re-read the
    /// word with an acquiring load after waking.
    ///
    /// `futex(FUTEX_WAIT_BITSET)` with an absolute `CLOCK_MONOTONIC` deadline.
    @available(*, noasync, message: "sleeps the thread in the kernel; async code cannot wait on a futex")
    public func wait(expecting expected: UInt32, until deadline: MonotonicClock.Instant? = nil) -> WaitResult {
        let deadlineNs: Int64 = (deadline?.isDistantFuture ?? true) ? -1 : max(deadline!.nanoseconds, 0)
        while true {
            let rc = cshims_futex_wait(word, expected, deadlineNs, isProcessShared)
            switch -rc {
            case 0: return .woken
            case EAGAIN: return .valueChanged
            case ETIMEDOUT: return .timedOut
            case EINTR: continue
            default:
                // EFAULT (unmapped word), EINVAL (misaligned word or bad
                // deadline), ENOSYS: a bug, not the environment saying no.
                misuse("futex(FUTEX_WAIT_BITSET) on \(word) failed: \(errnoDescription(-rc))")
            }
        }
    }

    /// Sleeps while the word holds `expected` for at most `timeout`; see
    /// `wait(expecting:until:)`.
    @available(*, noasync, message: "sleeps the thread in the kernel; async code cannot wait on a futex")
    public func wait(expecting expected: UInt32, timeout: Duration) -> WaitResult {
        wait(expecting: expected, until: MonotonicClock.now.advanced(by: timeout))
    }

    /// Wakes at most `count` threads sleeping on the word and returns how many
    /// it woke. Does not block. Store the new value of the word (with a
    /// releasing atomic) before calling, so a woken thread sees it.
    /// `futex(FUTEX_WAKE)`.
    @discardableResult
    public func wake(_ count: Int = 1) -> Int {
        require(count > 0, "Futex.wake(_:): `count` is \(count); wake at least one thread")
        let rc = cshims_futex_wake(word, Int32(clamping: count), isProcessShared)
        if rc < 0 { misuse("futex(FUTEX_WAKE) on \(word) failed: \(errnoDescription(-rc))") }
        return Int(rc)
    }

    /// Wakes every thread sleeping on the word and returns how many it woke.
    @discardableResult
    public func wakeAll() -> Int {
        wake(Int(Int32.max))
    }

    /// Wakes at most `wakeCount` sleepers and moves up to `requeueCount` of the
    /// rest to sleep on `target` instead, without waking them; all provided
    /// the word still holds `expected`. Returns the number woken plus moved,
    /// or `nil` if the word had changed (nothing was done). Lets a condition
    /// variable hand its waiters to a mutex one at a time rather than waking
    /// them all to fight for it. Both futexes must have the same sharing.
    /// Does not block. `futex(FUTEX_CMP_REQUEUE)`.
    public func wakeAndRequeue(
        wakeCount: Int, requeueCount: Int, onto target: Futex, ifValue expected: UInt32
    ) -> Int? {
        require(
            target.isProcessShared == isProcessShared,
            "Futex.wakeAndRequeue: `target` and this futex differ in process sharing")
        let rc = cshims_futex_cmp_requeue(
            word, Int32(clamping: wakeCount), Int32(clamping: requeueCount), target.word, expected,
            isProcessShared)
        if rc == -EAGAIN { return nil }
        if rc < 0 { misuse("futex(FUTEX_CMP_REQUEUE) on \(word) failed: \(errnoDescription(-rc))") }
        return Int(rc)
    }
}
