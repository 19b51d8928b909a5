import CShims

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
    LockHooks.willLock(object: object)
    let entry = SynchronizedTable.enter(UInt(bitPattern: Int(bitPattern: ObjectIdentifier(object))))
    defer {
        LockHooks.willUnlock(object: object)
        SynchronizedTable.exit(entry)
    }
    return try body()
}

/// How many buckets the side table of `synchronized` hashes objects over
/// (each object in use still has a lock of its own).
package let synchronizedStripes = SynchronizedTable.count

@usableFromInline
enum SynchronizedTable {
    /// 256 buckets: with a few dozen objects in use at once the lists stay
    /// a few entries long, at 16 KiB of bucket heads.
    @usableFromInline static var count: Int { Int(CSHIMS_SYNC_BUCKETS) }

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
    ///      8  UInt    the holder's `cshims_thread_token()`, or 0 (atomic)
    ///     16  Int     the depth (only the holder touches it)
    ///     24  UInt    the identity of the object it is bound to (atomic;
    ///                 written only holding both the guard and the entry's
    ///                 lock, so a bucket never has two entries bound to one
    ///                 object)
    ///     32  UInt    the next entry's address (atomic, set before the entry
    ///                 is published)
    ///
    /// The buckets are a C array (`cshims_sync_buckets`), zero-filled by the
    /// loader, used through atomics and the locks only.

    @inlinable static var ownerOffset: Int { 8 }
    @inlinable static var depthOffset: Int { 16 }
    @inlinable static var objectOffset: Int { 24 }
    @inlinable static var nextOffset: Int { 32 }

    @inlinable
    @inline(__always)
    static func bucket(of identity: UInt) -> UnsafeMutableRawPointer {
        // Fibonacci hashing of the address: spreads objects that malloc
        // placed at regular strides over all buckets.
        // The table is a C array, zero-filled by the loader: no lazy global
        // to initialize or check on this path.
        UnsafeMutableRawPointer(cshims_sync_bucket(UInt32(truncatingIfNeeded: (identity &* 0x9E37_79B9_7F4A_7C15) >> 56)))!
    }

    @inlinable
    @inline(__always)
    static func lock(of entry: UnsafeMutableRawPointer) -> PlainFutexMutex {
        PlainFutexMutex(word: entry.assumingMemoryBound(to: UInt32.self))
    }

    @inlinable
    @inline(__always)
    static func boundObject(_ entry: UnsafeMutableRawPointer) -> UInt {
        word(at: entry + objectOffset, acquiring: false)
    }

    // The fast path's atomics call the C shims directly: the generic
    // `AtomicMemory` forms, specialized but not inlined into this larger
    // function, were each a call (20.9 ns per uncontended `synchronized`
    // against 7.2 ns this way, same machine and hour).

    /// An atomic load of the word at `address`, relaxed or acquiring.
    @inlinable
    @inline(__always)
    static func word(at address: UnsafeMutableRawPointer, acquiring: Bool) -> UInt {
        let order = acquiring ? CSHIMS_ORDER_ACQUIRE : CSHIMS_ORDER_RELAXED
        return UInt(cshims_atomic_load_u64(address.assumingMemoryBound(to: UInt64.self), Int32(order.rawValue)))
    }

    /// A relaxed atomic store of `value` to the word at `address`.
    @inlinable
    @inline(__always)
    static func setWord(_ value: UInt, at address: UnsafeMutableRawPointer) {
        cshims_atomic_store_u64(
            address.assumingMemoryBound(to: UInt64.self), UInt64(value), Int32(CSHIMS_ORDER_RELAXED.rawValue))
    }

    /// `lock(of: entry).tryLock()` for an entry's lock that is free and
    /// nobody sleeps on (the common case): one acquiring compare-and-swap;
    /// anything else goes to the lock's own `tryLock`.
    @inlinable
    @inline(__always)
    static func tryLockEntry(_ entry: UnsafeMutableRawPointer) -> Bool {
        var expected: UInt32 = 0
        if cshims_atomic_cas_u32(
            entry.assumingMemoryBound(to: UInt32.self), &expected, LockWord.locked, Int32(CSHIMS_ORDER_ACQUIRE.rawValue))
        {
            LockHooks.tsanAcquired(entry, LockHooks.tsanTry)
            return true
        }
        return lock(of: entry).tryLock()
    }

    /// `lock(of: entry).unlock()`: one releasing compare-and-swap when
    /// nobody sleeps on it, else the lock's own slow path.
    @inlinable
    @inline(__always)
    static func unlockEntry(_ entry: UnsafeMutableRawPointer) {
        LockHooks.tsanReleasing(entry)
        var expected = LockWord.locked
        if !cshims_atomic_cas_u32(
            entry.assumingMemoryBound(to: UInt32.self), &expected, 0, Int32(CSHIMS_ORDER_RELEASE.rawValue))
        {
            lock(of: entry).unlockContended()
        }
    }

    /// Finds the entry of the object whose identity is `identity` and locks it (or deepens the caller's hold).
    /// Without contention: a walk of the bucket's list and one
    /// compare-and-swap. Blocks while another thread holds the lock.
    @inlinable
    @inline(__always)
    static func enter(_ identity: UInt) -> UnsafeMutableRawPointer {
        Perturbation.point(.lockAcquire)
        let me = UInt(cshims_thread_token())
        // Acquiring: pairs with the releasing store that published the entry.
        var address = word(at: bucket(of: identity) + 8, acquiring: true)
        while let entry = UnsafeMutableRawPointer(bitPattern: address) {
            if boundObject(entry) == identity {
                // Relaxed: only this thread ever stores its own identity here.
                if word(at: entry + ownerOffset, acquiring: false) == me {
                    entry.storeBytes(of: entry.load(fromByteOffset: depthOffset, as: Int.self) + 1,
                                     toByteOffset: depthOffset, as: Int.self)
                    return entry
                }
                // Still bound to `object` once locked: it is the one (only a
                // holder of the lock rebinds it).
                if tryLockEntry(entry) {
                    if boundObject(entry) == identity {
                        took(entry, me)
                        return entry
                    }
                    unlockEntry(entry)
                }
                break
            }
            address = word(at: entry + nextOffset, acquiring: true)
        }
        return enterContended(identity, me)
    }

    @inlinable
    @inline(__always)
    static func took(_ entry: UnsafeMutableRawPointer, _ me: UInt) {
        setWord(me, at: entry + ownerOffset)
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
    @inline(__always)
    static func exit(_ entry: UnsafeMutableRawPointer) {
        let depth = entry.load(fromByteOffset: depthOffset, as: Int.self) - 1
        entry.storeBytes(of: depth, toByteOffset: depthOffset, as: Int.self)
        if depth == 0 {
            setWord(0, at: entry + ownerOffset)
            unlockEntry(entry)
            Perturbation.point(.lockRelease)
        }
    }
}
