import CShims

/// The epoch word of state that a child process repairs on its first use
/// after `fork()`: the fork epoch (`cshims_fork_epoch`) the state was last
/// made good for, or `repairing` while a thread repairs it. Shared by
/// `ForkRepairedLock` and a `WorkQueue`'s repair.
///
/// One thread repairs, the first to swap the word from an old epoch to
/// `repairing` (`claim`); the others sleep on the word (a futex wait: no
/// `sched_yield` on a lock path) until the repairer stores the child's
/// epoch (`finish`, a releasing store paired with their acquiring load).
enum ForkEpochRepair {
    static let repairing = UInt32.max

    /// Whether `word` holds the current fork epoch: one relaxed load and
    /// compare, for the fast path.
    @inline(__always)
    static func isCurrent(_ word: UnsafeMutablePointer<UInt32>) -> Bool {
        AtomicMemory.load(from: word, ordering: .relaxed) == cshims_fork_epoch()
    }

    /// True when the caller is to repair (it swapped the word to
    /// `repairing`, and must call `finish`); false once the word holds the
    /// current epoch (another thread repaired meanwhile). Blocks while
    /// another thread repairs.
    static func claim(_ word: UnsafeMutablePointer<UInt32>) -> Bool {
        let current = cshims_fork_epoch()
        while true {
            let seen = AtomicMemory.load(from: word, ordering: .acquiring)
            if seen == current { return false }
            if seen == repairing {
                _ = Futex(word).wait(expecting: seen)
                continue
            }
            if AtomicMemory.compareExchange(expected: seen, desired: repairing, at: word, ordering: .acquiring).exchanged {
                return true
            }
        }
    }

    /// After the repair `claim` handed the caller: stores the current epoch
    /// (releasing what the repair wrote) and wakes the threads waiting.
    static func finish(_ word: UnsafeMutablePointer<UInt32>) {
        AtomicMemory.store(cshims_fork_epoch(), to: word, ordering: .releasing)
        _ = Futex(word).wakeAll()
    }
}

/// A short lock that a child process after `fork()` never waits for on a
/// parent thread's account: for state a process may touch after it forked
/// with other threads running (a port's state, which the child reads to
/// find that its connection is the parent's).
///
/// A thread of the parent may have held the lock at the fork, and nobody
/// releases it in the child, where that thread does not exist. So the first
/// hold in a new fork epoch (`cshims_fork_epoch`, which `ForkHandlers`'
/// child handler advances) makes the lock free again instead of waiting,
/// one thread repairing while the others sleep (`ForkEpochRepair`). Nobody
/// in the child can have taken the lock before (every hold starts in
/// `withLock`), so freeing it steals it from no one. What it guards was
/// written whole under the lock, by the parent, and is the parent's state:
/// the owner must tell it apart (by pid, say). Creating one installs the
/// fork handlers, so that epochs are counted in a process that made no
/// thread record or loop yet.
///
/// Costs one relaxed load and compare beyond the lock. For holds of a few
/// instructions, never across a wait (a `GuardLock`: no fairness policy).
final class ForkRepairedLock: @unchecked Sendable {
    // @unchecked: `lock` is touched through its atomics, `epochWord` only
    // atomically.

    private let lock = GuardLock()
    /// The fork epoch the lock was last made good for (`ForkEpochRepair`).
    private let epochWord: UnsafeMutablePointer<UInt32>

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
        if !ForkEpochRepair.isCurrent(epochWord) { repairAfterFork() }
        return try lock.withLock(body)
    }

    @inline(never)
    private func repairAfterFork() {
        guard ForkEpochRepair.claim(epochWord) else { return }
        lock.reinitializeAfterFork()
        ForkEpochRepair.finish(epochWord)
    }
}
