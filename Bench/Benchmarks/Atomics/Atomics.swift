// Spindle's AtomicMemory beside Synchronization.Atomic: the same operation,
// with the same ordering, on a word alone on its cache line, one thread.
//
// What is compared is the cost of reaching the instruction: Spindle goes
// through @inlinable Swift into `static inline` C (`__atomic` builtins),
// Synchronization through the compiler's builtins directly. Equal medians
// mean Spindle's fast path inlined down to the same instruction; a Spindle
// row several times slower would mean a call survived.
//
// Orderings are written out at each call, never passed in a variable: a
// constant ordering is what real code has, and it lets both sides compile
// to one instruction instead of a switch over orderings.

import Benchmark
import BenchSupport
import Spindle
import Synchronization

let benchmarks: @Sendable () -> Void = {
    // Every group gets fresh words, so no group sees another's cache state.
    func spindleWord<T: AtomicMemoryWord>(_ value: T) -> UnsafeMutablePointer<T> {
        allocateOnOwnCacheLine(value)
    }
    func atomicWord<T: AtomicRepresentable>(_ value: T) -> UnsafeMutablePointer<Atomic<T>> {
        allocateOnOwnCacheLine(Atomic(value))
    }
    let reference = "Synchronization.Atomic"

    // MARK: Load and store

    do {
        let word = spindleWord(Int64(42))
        let atomic = atomicWord(Int64(42))
        sideBySide(
            group: "atomic.load.64 relaxed",
            spindle: { benchmark in
                benchmark.repeatOperation { AtomicMemory.load(from: word, ordering: .relaxed) }
            },
            peers: [
                .reference(reference) { benchmark in
                    benchmark.repeatOperation { atomic.pointee.load(ordering: .relaxed) }
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.store.64 relaxed",
            spindle: { benchmark in
                var value: Int64 = 0
                benchmark.repeatOperation {
                    value &+= 1
                    AtomicMemory.store(value, to: word, ordering: .relaxed)
                }
            },
            peers: [
                .reference(reference) { benchmark in
                    var value: Int64 = 0
                    benchmark.repeatOperation {
                        value &+= 1
                        atomic.pointee.store(value, ordering: .relaxed)
                    }
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.store.64 sequentiallyConsistent",
            spindle: { benchmark in
                var value: Int64 = 0
                benchmark.repeatOperation {
                    value &+= 1
                    AtomicMemory.store(value, to: word, ordering: .sequentiallyConsistent)
                }
            },
            peers: [
                .reference(reference) { benchmark in
                    var value: Int64 = 0
                    benchmark.repeatOperation {
                        value &+= 1
                        atomic.pointee.store(value, ordering: .sequentiallyConsistent)
                    }
                },
            ]
        )
    }

    // MARK: Add, returning the new value

    do {
        let word = spindleWord(Int32(0))
        let atomic = atomicWord(Int32(0))
        sideBySide(
            group: "atomic.add.32 relaxed",
            spindle: { benchmark in
                benchmark.repeatOperation { AtomicMemory.add(3, to: word, ordering: .relaxed) }
            },
            peers: [
                .reference(reference) { benchmark in
                    benchmark.repeatOperation { atomic.pointee.wrappingAdd(3, ordering: .relaxed).newValue }
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int32(0))
        let atomic = atomicWord(Int32(0))
        sideBySide(
            group: "atomic.add.32 sequentiallyConsistent",
            spindle: { benchmark in
                benchmark.repeatOperation { AtomicMemory.add(3, to: word, ordering: .sequentiallyConsistent) }
            },
            peers: [
                .reference(reference) { benchmark in
                    benchmark.repeatOperation {
                        atomic.pointee.wrappingAdd(3, ordering: .sequentiallyConsistent).newValue
                    }
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.add.64 relaxed",
            spindle: { benchmark in
                benchmark.repeatOperation { AtomicMemory.add(3, to: word, ordering: .relaxed) }
            },
            peers: [
                .reference(reference) { benchmark in
                    benchmark.repeatOperation { atomic.pointee.wrappingAdd(3, ordering: .relaxed).newValue }
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.add.64 sequentiallyConsistent",
            spindle: { benchmark in
                benchmark.repeatOperation { AtomicMemory.add(3, to: word, ordering: .sequentiallyConsistent) }
            },
            peers: [
                .reference(reference) { benchmark in
                    benchmark.repeatOperation {
                        atomic.pointee.wrappingAdd(3, ordering: .sequentiallyConsistent).newValue
                    }
                },
            ]
        )
    }

    // MARK: Exchange and bitwise or

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.exchange.64 sequentiallyConsistent",
            spindle: { benchmark in
                var value: Int64 = 0
                benchmark.repeatOperation {
                    value &+= 1
                    return AtomicMemory.exchange(value, at: word, ordering: .sequentiallyConsistent)
                }
            },
            peers: [
                .reference(reference) { benchmark in
                    var value: Int64 = 0
                    benchmark.repeatOperation {
                        value &+= 1
                        return atomic.pointee.exchange(value, ordering: .sequentiallyConsistent)
                    }
                },
            ]
        )
    }

    do {
        // The mask walks over the 64 bits, so the word keeps changing until
        // it is all ones; the result (the new value) is used on both sides.
        let word = spindleWord(UInt64(0))
        let atomic = atomicWord(UInt64(0))
        sideBySide(
            group: "atomic.or.64 sequentiallyConsistent",
            spindle: { benchmark in
                var bit: UInt64 = 0
                benchmark.repeatOperation {
                    bit = (bit &+ 1) & 63
                    return AtomicMemory.or(1 << bit, into: word, ordering: .sequentiallyConsistent)
                }
            },
            peers: [
                .reference(reference) { benchmark in
                    var bit: UInt64 = 0
                    benchmark.repeatOperation {
                        bit = (bit &+ 1) & 63
                        return atomic.pointee.bitwiseOr(1 << bit, ordering: .sequentiallyConsistent).newValue
                    }
                },
            ]
        )
    }

    // MARK: Compare and swap, always succeeding (v to v + 1)

    do {
        let word = spindleWord(Int32(0))
        let atomic = atomicWord(Int32(0))
        sideBySide(
            group: "atomic.cas.32 sequentiallyConsistent",
            spindle: { benchmark in
                var expected = AtomicMemory.load(from: word, ordering: .relaxed)
                benchmark.repeatOperation {
                    let swapped = AtomicMemory.compareAndSwap(
                        expected: expected, desired: expected &+ 1, at: word, ordering: .sequentiallyConsistent)
                    expected &+= 1
                    return swapped
                }
                precondition(AtomicMemory.load(from: word) == expected, "a Spindle CAS failed")
            },
            peers: [
                .reference(reference) { benchmark in
                    var expected = atomic.pointee.load(ordering: .relaxed)
                    benchmark.repeatOperation {
                        let swapped = atomic.pointee.compareExchange(
                            expected: expected, desired: expected &+ 1, ordering: .sequentiallyConsistent
                        ).exchanged
                        expected &+= 1
                        return swapped
                    }
                    precondition(atomic.pointee.load(ordering: .relaxed) == expected, "an Atomic CAS failed")
                },
            ]
        )
    }

    do {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.cas.64 sequentiallyConsistent",
            spindle: { benchmark in
                var expected = AtomicMemory.load(from: word, ordering: .relaxed)
                benchmark.repeatOperation {
                    let swapped = AtomicMemory.compareAndSwap(
                        expected: expected, desired: expected &+ 1, at: word, ordering: .sequentiallyConsistent)
                    expected &+= 1
                    return swapped
                }
                precondition(AtomicMemory.load(from: word) == expected, "a Spindle CAS failed")
            },
            peers: [
                .reference(reference) { benchmark in
                    var expected = atomic.pointee.load(ordering: .relaxed)
                    benchmark.repeatOperation {
                        let swapped = atomic.pointee.compareExchange(
                            expected: expected, desired: expected &+ 1, ordering: .sequentiallyConsistent
                        ).exchanged
                        expected &+= 1
                        return swapped
                    }
                    precondition(atomic.pointee.load(ordering: .relaxed) == expected, "an Atomic CAS failed")
                },
            ]
        )
    }

    // MARK: Test-and-set (the guide's bit order: bit n is 0x80 >> (n & 7) of byte n >> 3)

    do {
        // Bit 5 of byte 0 is the mask 0x04 on both sides. After the first
        // call the bit stays set: each call is a locked read-modify-write
        // that reports the bit was already 1.
        let bytes = allocateOnOwnCacheLine(UInt8(0))
        let atomic = atomicWord(UInt8(0))
        sideBySide(
            group: "atomic.testAndSet sequentiallyConsistent",
            spindle: { benchmark in
                benchmark.repeatOperation {
                    AtomicMemory.testAndSet(bit: 5, at: UnsafeMutableRawPointer(bytes), ordering: .sequentiallyConsistent)
                }
            },
            peers: [
                .reference("Synchronization.Atomic.bitwiseOr") { benchmark in
                    benchmark.repeatOperation {
                        atomic.pointee.bitwiseOr(0x80 >> 5, ordering: .sequentiallyConsistent).oldValue & (0x80 >> 5) != 0
                    }
                },
            ]
        )
    }

    // MARK: Full fence

    sideBySide(
        group: "atomic.fence sequentiallyConsistent",
        spindle: { benchmark in
            benchmark.repeatOperation { memoryBarrier() }
        },
        peers: [
            .reference("Synchronization.atomicMemoryFence") { benchmark in
                benchmark.repeatOperation { atomicMemoryFence(ordering: .sequentiallyConsistent) }
            },
        ]
    )
}
