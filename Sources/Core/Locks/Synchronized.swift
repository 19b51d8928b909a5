#if canImport(Glibc)
import Glibc
#endif

/// Runs `body` holding the recursive lock of `object`: the `@synchronized`
/// directive. Two threads passing the same object exclude each other; two
/// threads passing different objects never wait for each other (beyond a
/// table guard held for a few instructions when an object first needs a
/// lock), so nesting `synchronized` on several objects deadlocks only where
/// the same nesting with one lock per object would. The lock is recursive on
/// one thread, like the original, and released on every path out of `body`,
/// including a thrown error.
///
/// Each object in use has a lock of its own, from a side table keyed by the
/// object's identity (as the Objective-C runtime keeps one). An entry stays
/// bound to its object after use, so the next `synchronized` on it finds it
/// without locking the table, and is rebound to another object once it is
/// free and needed. The table grows to the largest number of objects locked
/// at once and keeps that memory (one cache line per entry).
///
/// Blocks while another thread holds `object`'s lock: the lock is a plain
/// barging futex mutex (it spins briefly, then sleeps; not eventually fair,
/// like a recursive pthread mutex). Acquire/release ordering as for any
/// `Locking` lock. The object is only used for its identity; it is neither
/// retained past the call nor inspected.
@inlinable
public func synchronized<Result, Failure: Error>(
    _ object: AnyObject, _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    // The identity, not the object: no retain of it on the way in.
    let entry = SynchronizedTable.enter(UInt(bitPattern: Int(bitPattern: ObjectIdentifier(object))))
    defer { SynchronizedTable.exit(entry) }
    return try body()
}

/// How many buckets the side table of `synchronized` hashes objects over
/// (each object in use still has a lock of its own).
package let synchronizedStripes = SynchronizedTable.count

@usableFromInline
enum SynchronizedTable {
    /// 256 buckets: with a few dozen objects in use at once the lists stay
    /// a few entries long, at 16 KiB of bucket heads.
    @usableFromInline static let count = 256

    /// One cache line per bucket:
    ///
    ///      0  UInt32  the bucket's guard (a `PlainFutexMutex`), held only to
    ///                 bind an entry to an object or add an entry
    ///      8  UInt    the first entry's address (atomic; written under the
    ///                 guard, read without it: entries are only ever added,
    ///                 at the head, and never freed)
    ///
    /// One cache line per entry:
    ///
    ///      0  UInt32  the entry's lock (a `PlainFutexMutex`)
    ///      8  UInt    the holder's `pthread_self()`, or 0 (atomic)
    ///     16  Int     the depth (only the holder touches it)
    ///     24  UInt    the identity of the object it is bound to (atomic;
    ///                 written only holding both the guard and the entry's
    ///                 lock, so a bucket never has two entries bound to one
    ///                 object)
    ///     32  UInt    the next entry's address (atomic, set before the entry
    ///                 is published)
    ///
    /// `nonisolated(unsafe)`: the pointer is written once, by the lazy
    /// initializer; what it points to is used through atomics and the locks.
    @usableFromInline nonisolated(unsafe) static let buckets: UnsafeMutableRawPointer =
        allocateStableWords(byteCount: count * stableWordsAlignment)

    @inlinable static var ownerOffset: Int { 8 }
    @inlinable static var depthOffset: Int { 16 }
    @inlinable static var objectOffset: Int { 24 }
    @inlinable static var nextOffset: Int { 32 }

    @inlinable
    static func bucket(of identity: UInt) -> UnsafeMutableRawPointer {
        // Fibonacci hashing of the address: spreads objects that malloc
        // placed at regular strides over all buckets.
        buckets + Int(truncatingIfNeeded: (identity &* 0x9E37_79B9_7F4A_7C15) >> 56) * stableWordsAlignment
    }

    @inlinable
    static func lock(of entry: UnsafeMutableRawPointer) -> PlainFutexMutex {
        PlainFutexMutex(word: entry.assumingMemoryBound(to: UInt32.self))
    }

    @inlinable
    static func boundObject(_ entry: UnsafeMutableRawPointer) -> UInt {
        AtomicMemory.load(UInt.self, from: entry + objectOffset, ordering: .relaxed)
    }

    /// Finds the entry of the object whose identity is `identity` and locks it (or deepens the caller's hold).
    /// Without contention: a walk of the bucket's list and one
    /// compare-and-swap. Blocks while another thread holds the lock.
    @inlinable
    static func enter(_ identity: UInt) -> UnsafeMutableRawPointer {
        let me = UInt(bitPattern: Int(bitPattern: pthread_self()))
        // Acquiring: pairs with the releasing store that published the entry.
        var address = AtomicMemory.load(UInt.self, from: bucket(of: identity) + 8, ordering: .acquiring)
        while let entry = UnsafeMutableRawPointer(bitPattern: address) {
            if boundObject(entry) == identity {
                // Relaxed: only this thread ever stores its own identity here.
                if AtomicMemory.load(UInt.self, from: entry + ownerOffset, ordering: .relaxed) == me {
                    entry.storeBytes(of: entry.load(fromByteOffset: depthOffset, as: Int.self) + 1,
                                     toByteOffset: depthOffset, as: Int.self)
                    return entry
                }
                // Still bound to `object` once locked: it is the one (only a
                // holder of the lock rebinds it).
                if lock(of: entry).tryLock() {
                    if boundObject(entry) == identity {
                        took(entry, me)
                        return entry
                    }
                    lock(of: entry).unlock()
                }
                break
            }
            address = AtomicMemory.load(UInt.self, from: entry + nextOffset, ordering: .acquiring)
        }
        return enterContended(identity, me)
    }

    @inlinable
    static func took(_ entry: UnsafeMutableRawPointer, _ me: UInt) {
        AtomicMemory.store(me, to: entry + ownerOffset, as: UInt.self, ordering: .relaxed)
        entry.storeBytes(of: 1, toByteOffset: depthOffset, as: Int.self)
    }

    /// The object's entry is held by another thread, or it has none: under
    /// the bucket's guard, finds its entry (and waits for its lock outside
    /// the guard), or binds a free entry to it, or adds one.
    @usableFromInline
    @inline(never)
    static func enterContended(_ identity: UInt, _ me: UInt) -> UnsafeMutableRawPointer {
        let bucket = bucket(of: identity)
        let guardLock = PlainFutexMutex(word: bucket.assumingMemoryBound(to: UInt32.self))
        while true {
            guardLock.lock()
            var bound: UnsafeMutableRawPointer? = nil
            var free: UnsafeMutableRawPointer? = nil
            var address = AtomicMemory.load(UInt.self, from: bucket + 8, ordering: .relaxed)
            while let entry = UnsafeMutableRawPointer(bitPattern: address) {
                if boundObject(entry) == identity {
                    bound = entry
                    break
                }
                if free == nil && lock(of: entry).tryLock() { free = entry }
                address = AtomicMemory.load(UInt.self, from: entry + nextOffset, ordering: .relaxed)
            }
            if let bound {
                if let free { lock(of: free).unlock() }
                guardLock.unlock()
                lock(of: bound).lock()
                if boundObject(bound) == identity {
                    took(bound, me)
                    return bound
                }
                // Rebound to another object while this thread waited: look again.
                lock(of: bound).unlock()
                continue
            }
            let entry: UnsafeMutableRawPointer
            if let free {
                // Held by this thread and bound to no object in use.
                entry = free
                AtomicMemory.store(identity, to: entry + objectOffset, as: UInt.self, ordering: .relaxed)
            } else {
                entry = allocateStableWords(byteCount: stableWordsAlignment)
                _ = lock(of: entry).tryLock()
                AtomicMemory.store(identity, to: entry + objectOffset, as: UInt.self, ordering: .relaxed)
                AtomicMemory.store(
                    AtomicMemory.load(UInt.self, from: bucket + 8, ordering: .relaxed), to: entry + nextOffset,
                    as: UInt.self, ordering: .relaxed)
                // Releasing: publishes the entry's fields to lock-free readers.
                AtomicMemory.store(UInt(bitPattern: Int(bitPattern: entry)), to: bucket + 8, as: UInt.self,
                                   ordering: .releasing)
            }
            guardLock.unlock()
            took(entry, me)
            return entry
        }
    }

    /// Undoes one `enter`; the last one unlocks the entry (it stays bound).
    @inlinable
    static func exit(_ entry: UnsafeMutableRawPointer) {
        let depth = entry.load(fromByteOffset: depthOffset, as: Int.self) - 1
        entry.storeBytes(of: depth, toByteOffset: depthOffset, as: Int.self)
        if depth == 0 {
            AtomicMemory.store(0, to: entry + ownerOffset, as: UInt.self, ordering: .relaxed)
            lock(of: entry).unlock()
        }
    }
}
