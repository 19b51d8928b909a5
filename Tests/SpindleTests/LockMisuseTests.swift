import Spindle
import Testing
import TestSupport

/// Misuse stops the process with a clear message; each case runs in a child
/// process (exit test).
@Suite("Lock misuse")
struct LockMisuseTests {
    private func stderr(_ r: ExitTest.Result?) -> String {
        String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
    }

    @Test func unlockingAnUnlockedLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            Lock().unlock()
        }
        #expect(stderr(r).contains("unlock(): the lock is not locked"))
    }

    @Test func recursiveLockUnlockedByAnotherThread() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = RecursiveLock()
            lock.lock()
            let join = startThread { lock.unlock() }
            join()
        }
        #expect(stderr(r).contains("RecursiveLock.unlock(): the calling thread does not hold this lock"))
    }

    @Test func readUnlockWithoutReadLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            ReadWriteLock().readUnlock()
        }
        #expect(stderr(r).contains("ReadWriteLock.readUnlock(): the lock is not read-locked"))
    }

    @Test func writeUnlockOfAReadLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let rw = ReadWriteLock()
            rw.readLock()
            rw.writeUnlock()
        }
        #expect(stderr(r).contains("ReadWriteLock.writeUnlock(): the lock is not write-locked"))
    }

    @Test func spinLockUnbalancedUnlock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            SpinLock().unlock()
        }
        #expect(stderr(r).contains("SpinLock.unlock(): the lock is not locked"))
    }

    @Test func onceCalledFromItsOwnBody() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let once = Once()
            once.run { once.run {} }
        }
        #expect(stderr(r).contains("Once.run: called again from inside its own body"))
    }
}
