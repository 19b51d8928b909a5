import CShims

/// Test-and-set and test-and-clear (`OSAtomicTestAndSet`,
/// `OSAtomicTestAndClear` and their Barrier forms) over any length of memory.
///
/// Bits are numbered the guide's way, which is not the usual one: bit `n` is
/// the bit `0x80 >> (n & 7)` of the byte at `address + (n >> 3)`. Each byte is
/// numbered from its most significant bit, so on a little-endian machine the
/// lowest bit of an `Int32` is bit 7 and its highest is bit 24. Each call
/// touches exactly one byte, atomically, so a bit field of any size can be
/// shared by any number of threads (or processes, in shared memory).
///
/// None of these calls blocks. Ordering as for every `AtomicMemory` call:
/// `.relaxed` is the plain form, `.barrier` the Barrier form.
extension AtomicMemory {
    /// Sets bit `bit` of the memory at `address` to 1 and returns its old
    /// value. The caller guarantees the byte `bit >> 3` is inside its memory;
    /// prefer the buffer form, which checks. A negative `bit` stops the
    /// process with a message.
    @inlinable
    public static func testAndSet(
        bit: Int, at address: UnsafeMutableRawPointer, ordering: Ordering = .relaxed
    ) -> Bool {
        require(bit >= 0, "AtomicMemory.testAndSet(bit:at:): `bit` is \(bit); bit numbers start at 0")
        return cshims_atomic_test_and_set_bit(address, UInt64(bit), ordering.rmw)
    }

    /// Sets bit `bit` to 0 and returns its old value; see `testAndSet(bit:at:)`.
    @inlinable
    public static func testAndClear(
        bit: Int, at address: UnsafeMutableRawPointer, ordering: Ordering = .relaxed
    ) -> Bool {
        require(bit >= 0, "AtomicMemory.testAndClear(bit:at:): `bit` is \(bit); bit numbers start at 0")
        return cshims_atomic_test_and_clear_bit(address, UInt64(bit), ordering.rmw)
    }

    /// Sets bit `bit` of `buffer` to 1 and returns its old value. A bit outside
    /// the buffer (`bit < 0` or `bit >= buffer.count * 8`) stops the process
    /// with a message naming `bit` and the buffer's extent.
    @inlinable
    public static func testAndSet(
        bit: Int, in buffer: UnsafeMutableRawBufferPointer, ordering: Ordering = .relaxed
    ) -> Bool {
        let base = checkedBit(bit, buffer, "testAndSet(bit:in:)")
        return cshims_atomic_test_and_set_bit(base, UInt64(bit), ordering.rmw)
    }

    /// Sets bit `bit` of `buffer` to 0 and returns its old value; bounds are
    /// checked as for `testAndSet(bit:in:)`.
    @inlinable
    public static func testAndClear(
        bit: Int, in buffer: UnsafeMutableRawBufferPointer, ordering: Ordering = .relaxed
    ) -> Bool {
        let base = checkedBit(bit, buffer, "testAndClear(bit:in:)")
        return cshims_atomic_test_and_clear_bit(base, UInt64(bit), ordering.rmw)
    }

    /// The value of bit `bit` (in the guide's numbering) of `buffer`, read
    /// atomically with `ordering`'s load half.
    @inlinable
    public static func testBit(
        _ bit: Int, in buffer: UnsafeMutableRawBufferPointer, ordering: Ordering = .relaxed
    ) -> Bool {
        let base = checkedBit(bit, buffer, "testBit(_:in:)")
        return cshims_atomic_test_bit(base, UInt64(bit), ordering.load)
    }

    @inlinable
    internal static func checkedBit(
        _ bit: Int, _ buffer: UnsafeMutableRawBufferPointer, _ api: @autoclosure () -> String
    ) -> UnsafeMutableRawPointer {
        guard let base = buffer.baseAddress, bit >= 0, bit < buffer.count &* 8 else {
            misuse("AtomicMemory.\(api()): `bit` \(bit) is outside the buffer's \(buffer.count * 8) bits (0..<\(buffer.count * 8))")
        }
        return base
    }
}
