import Spindle
import Testing
import TestSupport

@Suite("AtomicMemory")
struct AtomicMemoryTests {
    /// The guide's Listing 4-1, call for call, with its exact values.
    @Test func listing4_1() {
        withZeroedWords(Int32.self, count: 1) { theValue in
            _ = AtomicMemory.testAndSet(bit: 0, at: theValue)
            #expect(theValue.pointee == 128)

            theValue.pointee = 0
            _ = AtomicMemory.testAndSet(bit: 7, at: theValue)
            #expect(theValue.pointee == 1)

            theValue.pointee = 0
            _ = AtomicMemory.testAndSet(bit: 15, at: theValue)
            #expect(theValue.pointee == 256)

            #expect(AtomicMemory.compareAndSwap(expected: 256, desired: 512, at: theValue))
            #expect(theValue.pointee == 512)

            #expect(!AtomicMemory.compareAndSwap(expected: 256, desired: 1024, at: theValue))
            #expect(theValue.pointee == 512)
        }
    }

    /// The guide's examples of its bit order: bit 7 is the lowest bit of a
    /// little-endian Int32, bit 24 its highest.
    @Test func testAndSetBitOrderOnInt32() {
        withZeroedWords(UInt32.self, count: 1) { word in
            #expect(!AtomicMemory.testAndSet(bit: 7, at: word, ordering: .barrier))
            #expect(word.pointee == 1)
            #expect(!AtomicMemory.testAndSet(bit: 24, at: word, ordering: .barrier))
            #expect(word.pointee == 0x8000_0001)
            #expect(AtomicMemory.testAndSet(bit: 24, at: word), "setting a set bit returns true")
            #expect(AtomicMemory.testAndClear(bit: 24, at: word))
            #expect(!AtomicMemory.testAndClear(bit: 24, at: word), "clearing a clear bit returns false")
            #expect(word.pointee == 1)
        }
    }

    @Test func testAndSetCoversEveryBitOfALongBuffer() {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 37, alignment: 1)
        defer { buffer.deallocate() }
        buffer.initializeMemory(as: UInt8.self, repeating: 0)
        for bit in 0..<(37 * 8) {
            #expect(!AtomicMemory.testBit(bit, in: buffer))
            #expect(!AtomicMemory.testAndSet(bit: bit, in: buffer, ordering: bit.isMultiple(of: 2) ? .relaxed : .barrier))
            #expect(AtomicMemory.testBit(bit, in: buffer))
            // Exactly the formula's byte and mask changed.
            #expect(buffer[bit >> 3] & UInt8(0x80 >> (bit & 7)) != 0)
        }
        #expect(buffer.allSatisfy { $0 == 0xFF })
        for bit in stride(from: 0, to: 37 * 8, by: 3) {
            #expect(AtomicMemory.testAndClear(bit: bit, in: buffer))
        }
        #expect(!AtomicMemory.testBit(3, in: buffer))
        #expect(AtomicMemory.testBit(4, in: buffer))
    }

    @Test(arguments: [AtomicMemory.Ordering.relaxed, .acquiring, .releasing, .acquiringAndReleasing, .barrier])
    func arithmeticReturnsNewValue(ordering: AtomicMemory.Ordering) {
        withZeroedWords(Int32.self, count: 1) { p in
            #expect(AtomicMemory.add(5, to: p, ordering: ordering) == 5)
            #expect(AtomicMemory.add(-7, to: p, ordering: ordering) == -2)
            #expect(AtomicMemory.increment(p, ordering: ordering) == -1)
            #expect(AtomicMemory.increment(p, ordering: ordering) == 0)
            #expect(AtomicMemory.decrement(p, ordering: ordering) == -1)
            p.pointee = .max
            #expect(AtomicMemory.increment(p, ordering: ordering) == .min, "wraps like OSAtomicIncrement32")
        }
        withZeroedWords(Int64.self, count: 1) { p in
            #expect(AtomicMemory.add(1 << 40, to: p, ordering: ordering) == 1 << 40)
            #expect(AtomicMemory.decrement(p, ordering: ordering) == (1 << 40) - 1)
            #expect(AtomicMemory.increment(p, ordering: ordering) == 1 << 40)
        }
        withZeroedWords(UInt64.self, count: 1) { p in
            #expect(AtomicMemory.decrement(p, ordering: ordering) == .max, "unsigned wraps")
            #expect(AtomicMemory.add(2, to: p, ordering: ordering) == 1)
        }
        withZeroedWords(UInt.self, count: 1) { p in
            #expect(AtomicMemory.add(3, to: p, ordering: ordering) == 3)
        }
    }

    @Test(arguments: [AtomicMemory.Ordering.relaxed, .barrier])
    func logicReturnsNewOrOriginal(ordering: AtomicMemory.Ordering) {
        withZeroedWords(UInt32.self, count: 1) { p in
            p.pointee = 0b1100
            #expect(AtomicMemory.or(0b0011, into: p, ordering: ordering) == 0b1111)
            #expect(AtomicMemory.and(0b0110, into: p, ordering: ordering) == 0b0110)
            #expect(AtomicMemory.xor(0b0101, into: p, ordering: ordering) == 0b0011)
            #expect(AtomicMemory.orOriginal(0b1000, into: p, ordering: ordering) == 0b0011)
            #expect(p.pointee == 0b1011)
            #expect(AtomicMemory.andOriginal(0b0001, into: p, ordering: ordering) == 0b1011)
            #expect(p.pointee == 0b0001)
            #expect(AtomicMemory.xorOriginal(0b0001, into: p, ordering: ordering) == 0b0001)
            #expect(p.pointee == 0)
        }
        withZeroedWords(Int32.self, count: 1) { p in
            #expect(AtomicMemory.or(Int32.min, into: p, ordering: ordering) == .min)
            #expect(AtomicMemory.xor(-1, into: p, ordering: ordering) == .max)
        }
        withZeroedWords(UInt64.self, count: 1) { p in
            #expect(AtomicMemory.or(1 << 63, into: p, ordering: ordering) == 1 << 63)
            #expect(AtomicMemory.andOriginal(0, into: p, ordering: ordering) == 1 << 63)
        }
    }

    @Test func compareAndSwapEveryWidth() {
        withZeroedWords(Int64.self, count: 1) { p in
            #expect(AtomicMemory.compareAndSwap(expected: 0, desired: -1, at: p, ordering: .barrier))
            #expect(!AtomicMemory.compareAndSwap(expected: 0, desired: 5, at: p, ordering: .barrier))
            let r = AtomicMemory.compareExchange(expected: 3, desired: 4, at: p)
            #expect(!r.exchanged && r.original == -1)
        }
        withZeroedWords(Int.self, count: 1) { p in
            #expect(AtomicMemory.compareAndSwap(expected: 0, desired: .max, at: p))
            #expect(p.pointee == .max)
        }
        withZeroedWords(UInt32.self, count: 1) { p in
            let r = AtomicMemory.compareExchange(expected: 0, desired: .max, at: p, ordering: .acquiring)
            #expect(r.exchanged && r.original == 0)
        }
        // Pointer-sized slot holding a pointer.
        let slot = UnsafeMutablePointer<UnsafeMutableRawPointer?>.allocate(capacity: 1)
        defer { slot.deallocate() }
        slot.initialize(to: nil)
        let a = UnsafeMutableRawPointer(bitPattern: 0x1000)!
        let b = UnsafeMutableRawPointer(bitPattern: 0x2000)!
        #expect(AtomicMemory.compareAndSwap(expected: nil, desired: a, at: slot, ordering: .barrier))
        #expect(!AtomicMemory.compareAndSwap(expected: nil, desired: b, at: slot))
        #expect(AtomicMemory.compareAndSwap(expected: a, desired: b, at: slot))
        #expect(slot.pointee == b)
    }

    @Test func loadStoreExchange() {
        withZeroedWords(UInt64.self, count: 1) { p in
            AtomicMemory.store(.max, to: p, ordering: .releasing)
            #expect(AtomicMemory.load(from: p, ordering: .acquiring) == .max)
            #expect(AtomicMemory.exchange(7, at: p, ordering: .barrier) == .max)
            #expect(AtomicMemory.load(from: p) == 7)
        }
        withZeroedWords(Int32.self, count: 1) { p in
            AtomicMemory.store(-3, to: p, ordering: .acquiringAndReleasing)
            #expect(AtomicMemory.load(from: p, ordering: .releasing) == -3)
            #expect(AtomicMemory.exchange(9, at: p) == -3)
        }
    }

    /// Regression: a typed pointer with an integer literal must use the
    /// pointer's width, not convert to a raw pointer and infer `Int`.
    @Test func typedPointerKeepsItsWidth() {
        withZeroedWords(Int32.self, count: 2) { p in
            let r = AtomicMemory.add(5, to: p)
            #expect(type(of: r) == Int32.self)
            #expect(r == 5)
            #expect(p[1] == 0)
        }
    }

    /// The raw-pointer forms work on memory Spindle did not allocate, with
    /// the word type taken from the value.
    @Test func rawPointerForms() {
        let raw = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 8)
        defer { raw.deallocate() }
        raw.initializeMemory(as: UInt8.self, repeating: 0, count: 16)
        #expect(AtomicMemory.add(41, to: raw, as: Int64.self) == 41)
        #expect(AtomicMemory.compareAndSwap(expected: 41, desired: 42, at: raw, as: Int64.self))
        #expect(AtomicMemory.load(Int64.self, from: raw) == 42)
        AtomicMemory.store(7, to: raw + 8, as: UInt32.self)
        #expect(AtomicMemory.add(1, to: raw + 8, as: UInt32.self, ordering: .barrier) == 8)
        #expect(AtomicMemory.load(UInt32.self, from: raw + 12) == 0, "a 32-bit add touched only 4 bytes")
    }

    @Test func barriersAndHintRun() {
        // They order memory; the observable contract here is only that they
        // exist on this architecture and return.
        memoryBarrier()
        hardwareMemoryBarrier()
        loadBarrier()
        storeBarrier()
        acquireBarrier()
        releaseBarrier()
        compilerBarrier()
        spinLoopHint()
    }
}
