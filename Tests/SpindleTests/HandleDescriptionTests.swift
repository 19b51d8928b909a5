import Spindle
import Testing
import TestSupport

/// `print(lock)` shows whether the lock is held, not its storage.
@Suite("Handle descriptions")
struct HandleDescriptionTests {
    @Test func lockSaysWhetherItIsHeld() {
        let lock = Lock()
        #expect(lock.description == "Lock(unlocked)")
        lock.lock()
        #expect(lock.description == "Lock(locked)")
        lock.unlock()
        #expect("\(lock)" == "Lock(unlocked)")
    }

    @Test func recursiveLockSaysWhoHoldsIt() {
        let lock = RecursiveLock()
        #expect(lock.description == "RecursiveLock(unlocked)")
        lock.lock()
        #expect(lock.description == "RecursiveLock(locked by the calling thread)")
        let seen = LockedValue("")
        let join = startThread { seen.withLock { $0 = lock.description } }
        join()
        #expect(seen.withLock { $0 } == "RecursiveLock(locked)")
        lock.unlock()
    }

    @Test func spinAndReadWriteLocks() {
        let spin = SpinLock()
        #expect(spin.description == "SpinLock(unlocked)")
        spin.lock()
        #expect(spin.description == "SpinLock(locked)")
        spin.unlock()
        let rw = ReadWriteLock()
        #expect(rw.description == "ReadWriteLock(unlocked)")
        rw.readLock()
        rw.readLock()
        #expect(rw.description == "ReadWriteLock(read-locked by 2)")
        rw.readUnlock()
        rw.readUnlock()
        rw.writeLock()
        #expect(rw.description == "ReadWriteLock(write-locked)")
        rw.writeUnlock()
    }
}
