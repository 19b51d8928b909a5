// Planted races inside Spindle critical sections. scripts/test builds this
// with ThreadSanitizer and Spindle's mutex annotations (`-Xcc
// -fsanitize=thread`, see cshims_tsan.h) and fails unless TSan reports each
// race naming the Spindle lock that one side held: "(mutexes: write M…)"
// for a `Lock` and a `RecursiveLock`, "(mutexes: read M…)" for a
// `ReadWriteLock` read hold, each mutex "created at" its Spindle
// initializer. Without the annotations TSan still finds the races but
// cannot say which lock was held.
//
// Each race: one thread writes a plain counter holding the lock, another
// writes it without taking the lock.
#if canImport(Glibc)
import Glibc
#endif
import Spindle

final class Counters: @unchecked Sendable {
    // @unchecked on purpose: the unlocked writes below are the bugs TSan must catch.
    var underLock = 0
    var underRecursiveLock = 0
    var underReadLock = 0
    let lock = Spindle.Lock()
    let recursive = RecursiveLock()
    let table = ReadWriteLock()
}

/// The careful side: every write holds the lock.
func writeHoldingTheLocks(_ arg: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let c = Unmanaged<Counters>.fromOpaque(arg!).takeUnretainedValue()
    for _ in 0..<1_000 {
        c.lock.withLock { c.underLock += 1 }
        c.recursive.withLock { c.recursive.withLock { c.underRecursiveLock += 1 } }
        c.table.withReadLock { c.underReadLock += 1 }  // a write under a read lock: a bug of its own
    }
    return nil
}

/// The careless side: the same writes without the locks.
func writeWithoutTheLocks(_ arg: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let c = Unmanaged<Counters>.fromOpaque(arg!).takeUnretainedValue()
    for _ in 0..<1_000 {
        c.underLock += 1
        c.underRecursiveLock += 1
        c.underReadLock += 1
    }
    return nil
}

@main
enum TSanLockCanary {
    static func main() {
        let counters = Counters()
        counters.lock.name = "canary"
        let arg = Unmanaged.passUnretained(counters).toOpaque()
        var careful = pthread_t()
        var careless = pthread_t()
        var rc = pthread_create(&careful, nil, writeHoldingTheLocks, arg)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        rc = pthread_create(&careless, nil, writeWithoutTheLocks, arg)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        pthread_join(careful, nil)
        pthread_join(careless, nil)
        print("TSanLockCanary: \(counters.underLock) \(counters.underRecursiveLock) \(counters.underReadLock) (raced on purpose)")
    }
}
