/// Runs `body` holding a lock keyed by `object`'s identity: the
/// `@synchronized` directive. Two threads passing the same object exclude
/// each other; passing different objects they usually do not. The lock is
/// recursive on one thread, like the original, and released on every path
/// out of `body`, including a thrown error.
///
/// No lock is created per object: `object`'s address picks one of a fixed
/// table of 256 recursive locks. Unrelated objects
/// that share a stripe only cost each other some waiting, with one exception:
/// nesting `synchronized` on two different objects can deadlock against
/// another thread nesting on two other objects whose stripes collide in the
/// opposite order. Keep nested `synchronized` blocks to a consistent order,
/// as you would with any two locks, or use a `Lock` of your own.
///
/// Blocks while another thread holds the stripe. Acquire/release ordering as
/// for any `Locking` lock. The object is only used for its address; it is
/// neither retained past the call nor inspected.
@inlinable
public func synchronized<Result, Failure: Error>(
    _ object: AnyObject, _ body: () throws(Failure) -> Result
) throws(Failure) -> Result {
    let stripe = SynchronizedTable.stripe(for: object)
    stripe.lock()
    defer { stripe.unlock() }
    return try body()
}

/// How many locks `synchronized` stripes objects over.
package let synchronizedStripes = SynchronizedTable.count

@usableFromInline
enum SynchronizedTable {
    /// 256 stripes: with a few dozen objects in `synchronized` at once the
    /// chance that two share a stripe stays small, at 16 KiB of locks.
    @usableFromInline static let count = 256

    /// One cache line per stripe (no false sharing between stripes):
    ///
    ///      0  UInt32  the lock word        4  UInt32  the heir word
    ///      8  UInt32  the queue word      12  UInt32  the tenant word
    ///     16  UInt    the holder          24  Int     the depth
    ///
    /// Allocated once and never freed, like the table of the original.
    /// `nonisolated(unsafe)`: the pointer is written once, by the lazy
    /// initializer; the stripes it points to are only used through atomics
    /// and the lock they implement.
    @usableFromInline nonisolated(unsafe) static let stripes: UnsafeMutablePointer<RecursiveMutex> = {
        let words = allocateStableWords(byteCount: count * stableWordsAlignment)
        let table = UnsafeMutablePointer<RecursiveMutex>.allocate(capacity: count)
        for i in 0..<count {
            let line = words + i * stableWordsAlignment
            (table + i).initialize(to: RecursiveMutex(
                words: line.assumingMemoryBound(to: UInt32.self),
                owner: (line + 16).assumingMemoryBound(to: UInt.self),
                depth: (line + 24).assumingMemoryBound(to: Int.self)))
        }
        return table
    }()

    @inlinable
    static func stripe(for object: AnyObject) -> RecursiveMutex {
        // Fibonacci hashing of the address: spreads objects that malloc
        // placed at regular strides over all stripes.
        let address = UInt(bitPattern: Int(bitPattern: ObjectIdentifier(object)))
        let index = Int(truncatingIfNeeded: (address &* 0x9E37_79B9_7F4A_7C15) >> 56)
        return stripes[index]
    }
}
