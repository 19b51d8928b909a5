import CShims

/// A short lock that a child process after `fork()` never waits for on a
/// parent thread's account: for state a process may touch after it forked
/// with other threads running (a port's state, which the child reads to
/// find that its connection is the parent's).
///
/// A thread of the parent may have held the lock at the fork, and nobody
/// releases it in the child, where that thread does not exist. So the first
/// hold in a new fork epoch (`cshims_fork_epoch`, which `ForkHandlers`'
/// child handler advances) makes the lock free again instead of waiting:
/// one thread repairs, the first to swap the epoch word to `repairing`,
/// and the others sleep on that word (a futex wait, as a queue's repair
/// does: no `sched_yield` on a lock path) until it holds the child's
/// epoch. Nobody in the child can have taken the lock before (every hold
/// starts in `withLock`), so freeing it steals it from no one. What it
/// guards was written whole under the lock, by the parent, and is the
/// parent's state: the owner must tell it apart (by pid, say). Creating one installs the fork handlers, so that
/// epochs are counted in a process that made no thread record or loop yet.
///
/// Costs one relaxed load and compare beyond the lock. For holds of a few
/// instructions, never across a wait (a `GuardLock`: no fairness policy).
final class ForkRepairedLock: @unchecked Sendable {
    // @unchecked: `lock` is touched through its atomics, `epochWord` only
    // atomically.

    private let lock = GuardLock()
    /// The fork epoch the lock was last made good for; `repairing` while a
    /// thread repairs it (a futex word: the others sleep on it then).
    private let epochWord: UnsafeMutablePointer<UInt32>
    private static let repairing = UInt32.max

    init() {
        ForkHandlers.install()
        epochWord = .allocate(capacity: 1)
        epochWord.initialize(to: cshims_fork_epoch())
    }

    deinit { epochWord.deallocate() }

    /// Runs `body` holding the lock, repairing it first in a process forked
    /// since it was last taken.
    @inline(__always)
    func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        if AtomicMemory.load(from: epochWord, ordering: .relaxed) != cshims_fork_epoch() { repairAfterFork() }
        return try lock.withLock(body)
    }

    @inline(never)
    private func repairAfterFork() {
        let current = cshims_fork_epoch()
        while true {
            let seen = AtomicMemory.load(from: epochWord, ordering: .acquiring)
            if seen == current { return }
            if seen == Self.repairing {
                _ = Futex(epochWord).wait(expecting: seen)
                continue
            }
            if AtomicMemory.compareExchange(
                expected: seen, desired: Self.repairing, at: epochWord, ordering: .acquiring
            ).exchanged { break }
        }
        lock.reinitializeAfterFork()
        AtomicMemory.store(current, to: epochWord, ordering: .releasing)
        _ = Futex(epochWord).wakeAll()
    }
}
