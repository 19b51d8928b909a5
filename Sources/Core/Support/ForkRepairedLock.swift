import CShims
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A short lock that a child process after `fork()` never waits for on a
/// parent thread's account: for state a process may touch after it forked
/// with other threads running (a port's state, which the child reads to
/// find that its connection is the parent's).
///
/// A thread of the parent may have held the lock at the fork, and nobody
/// releases it in the child, where that thread does not exist. So the first
/// hold in a new fork epoch (`cshims_fork_epoch`, which `ForkHandlers`'
/// child handler advances) makes the lock free again instead of waiting:
/// one thread repairs, the first to swap `epoch` to `repairing`, and the
/// others yield until it holds the child's epoch. Nobody in the child can
/// have taken the lock before (every hold starts in `withLock`), so freeing
/// it steals it from no one. What it guards was written whole under the
/// lock, by the parent, and is the parent's state: the owner must tell it
/// apart (by pid, say). Creating one installs the fork handlers, so that
/// epochs are counted in a process that made no thread record or loop yet.
///
/// Costs one relaxed load and compare beyond the lock. For holds of a few
/// instructions, never across a wait (a `GuardLock`: no fairness policy).
final class ForkRepairedLock: @unchecked Sendable {
    // @unchecked: `lock` is touched through its atomics, `epoch` is atomic.

    private let lock = GuardLock()
    /// The fork epoch the lock was last made good for; `repairing` while a
    /// thread repairs it.
    private let epoch: Atomic<UInt32>
    private static let repairing = UInt32.max

    init() {
        ForkHandlers.install()
        epoch = Atomic(cshims_fork_epoch())
    }

    /// Runs `body` holding the lock, repairing it first in a process forked
    /// since it was last taken.
    @inline(__always)
    func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        if epoch.load(ordering: .relaxed) != cshims_fork_epoch() { repairAfterFork() }
        return try lock.withLock(body)
    }

    @inline(never)
    private func repairAfterFork() {
        let current = cshims_fork_epoch()
        while true {
            let seen = epoch.load(ordering: .acquiring)
            if seen == current { return }
            if seen == Self.repairing {
                sched_yield()
                continue
            }
            if epoch.compareExchange(expected: seen, desired: Self.repairing, ordering: .acquiring).exchanged { break }
        }
        lock.reinitializeAfterFork()
        epoch.store(current, ordering: .releasing)
    }
}
