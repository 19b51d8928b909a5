/// Runs `body` holding the recursive lock of `object`: the `@synchronized`
/// directive. Two threads passing the same object exclude each other; two
/// threads passing different objects never wait for each other (beyond a
/// guard held for a few instructions), so nesting `synchronized` on several
/// objects deadlocks only where the same nesting with one lock per object
/// would. The lock is recursive on one thread, like the original, and
/// released on every path out of `body`, including a thrown error.
///
/// Each object in use has a lock of its own, from a side table keyed by the
/// object's identity (as the Objective-C runtime keeps one): an entry is
/// taken for an object while at least one thread is inside or waiting to
/// enter `synchronized` on it, and afterwards reused for any object. The
/// table grows to the largest number of objects in use at once and keeps
/// that memory (one cache line per entry).
///
/// Blocks while another thread holds `object`'s lock; the lock spins
/// briefly, then sleeps on a futex, as `RecursiveLock` does. Acquire/release
/// ordering as for any `Locking` lock. The object is only used for its
/// identity; it is neither retained past the call nor inspected.
@inlinable
public func synchronized<Result, Failure: Error>(
    _ object: AnyObject, _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    let entry = SynchronizedTable.enter(object)
    defer { SynchronizedTable.exit(entry) }
    return try body()
}

/// How many buckets the side table of `synchronized` hashes objects over
/// (each object in use still has a lock of its own).
public let synchronizedStripes = SynchronizedTable.count

@usableFromInline
enum SynchronizedTable {
    /// 256 buckets: with a few dozen objects in use at once the lists stay
    /// a few entries long, at 16 KiB of bucket heads.
    @usableFromInline static let count = 256

    /// One cache line per bucket:
    ///
    ///      0  UInt32   the bucket's guard (a `PlainFutexMutex`), held only
    ///                  to search or change the list
    ///      8  pointer  the first entry (guarded)
    ///
    /// One cache line per entry, allocated when no free entry is found and
    /// never freed (entries are reused):
    ///
    ///      0  UInt32 × 4  the recursive lock's mutex words (`FutexMutex`)
    ///     16  UInt     the holder           24  Int      the depth
    ///     32  UInt     the object's identity (guarded)
    ///     40  Int      users: threads inside or waiting (atomic; raised only
    ///                  under the guard, lowered anywhere; 0 = free for reuse)
    ///     48  pointer  the next entry (guarded)
    ///
    /// `nonisolated(unsafe)`: the pointer is written once, by the lazy
    /// initializer; what it points to is used through atomics and the guards.
    @usableFromInline nonisolated(unsafe) static let buckets: UnsafeMutableRawPointer =
        allocateStableWords(byteCount: count * stableWordsAlignment)

    static let entryObject = 32
    static let entryUsers = 40
    static let entryNext = 48

    /// The recursive lock of an entry.
    @usableFromInline
    static func lock(of entry: UnsafeMutableRawPointer) -> RecursiveMutex {
        RecursiveMutex(
            words: entry.assumingMemoryBound(to: UInt32.self),
            owner: (entry + 16).assumingMemoryBound(to: UInt.self),
            depth: (entry + 24).assumingMemoryBound(to: Int.self))
    }

    static func users(_ entry: UnsafeMutableRawPointer) -> UnsafeMutablePointer<Int> {
        (entry + entryUsers).assumingMemoryBound(to: Int.self)
    }

    /// Takes the entry of `object` (finding it, reusing a free one, or
    /// allocating one), counts the caller as a user, then locks it. Blocks
    /// while another thread holds the object's lock.
    @usableFromInline
    static func enter(_ object: AnyObject) -> UnsafeMutableRawPointer {
        let identity = UInt(bitPattern: Int(bitPattern: ObjectIdentifier(object)))
        // Fibonacci hashing of the address: spreads objects that malloc
        // placed at regular strides over all buckets.
        let index = Int(truncatingIfNeeded: (identity &* 0x9E37_79B9_7F4A_7C15) >> 56)
        let bucket = buckets + index * stableWordsAlignment
        let guardLock = PlainFutexMutex(word: bucket.assumingMemoryBound(to: UInt32.self))
        let head = (bucket + 8).assumingMemoryBound(to: UnsafeMutableRawPointer?.self)
        guardLock.lock()
        var free: UnsafeMutableRawPointer? = nil
        var found: UnsafeMutableRawPointer? = nil
        var next = head.pointee
        while let entry = next {
            // Acquiring: pairs with the releasing decrement in `exit`, so a
            // reused entry's lock words are seen as its last user left them.
            let users = AtomicMemory.load(from: users(entry), ordering: .acquiring)
            if users != 0 && entry.load(fromByteOffset: entryObject, as: UInt.self) == identity {
                found = entry
                break
            }
            if users == 0 && free == nil { free = entry }
            next = entry.load(fromByteOffset: entryNext, as: UnsafeMutableRawPointer?.self)
        }
        let entry: UnsafeMutableRawPointer
        if let found {
            entry = found
        } else if let free {
            // Users 0: nobody holds, waits for or is still leaving its lock
            // (a user unlocks before it stops counting), and only a thread
            // holding the guard could count itself in.
            entry = free
            entry.storeBytes(of: identity, toByteOffset: entryObject, as: UInt.self)
        } else {
            entry = allocateStableWords(byteCount: stableWordsAlignment)
            entry.storeBytes(of: identity, toByteOffset: entryObject, as: UInt.self)
            entry.storeBytes(of: head.pointee, toByteOffset: entryNext, as: UnsafeMutableRawPointer?.self)
            head.pointee = entry
        }
        AtomicMemory.increment(users(entry), ordering: .relaxed)
        guardLock.unlock()
        lock(of: entry).lock()
        return entry
    }

    /// Unlocks `entry`'s lock, then stops counting the caller as a user.
    @usableFromInline
    static func exit(_ entry: UnsafeMutableRawPointer) {
        lock(of: entry).unlock()
        // Releasing: a thread that reuses the entry (after seeing 0 under its
        // guard, an acquire there) finds the lock's words as left here.
        AtomicMemory.decrement(users(entry), ordering: .releasing)
    }
}
