// Spindle's AtomicMemory beside Synchronization.Atomic: the same operation,
// with the same ordering, on a word alone on its cache line, one thread.
//
// What is compared is the cost of reaching the instruction: Spindle goes
// through @inlinable Swift into `static inline` C (`__atomic` builtins),
// Synchronization through the compiler's builtins directly. Equal medians
// mean Spindle's fast path inlined down to the same instruction; a Spindle
// row several times slower would mean a call survived.

import Benchmark
import BenchSupport
import Spindle
import Synchronization

let benchmarks: @Sendable () -> Void = {
    // Each group gets fresh words, so no group sees another's cache state.
    func spindleWord<T: AtomicMemoryWord>(_ value: T) -> UnsafeMutablePointer<T> {
        allocateOnOwnCacheLine(value)
    }
    func atomicWord<T: AtomicRepresentable>(_ value: T) -> UnsafeMutablePointer<Atomic<T>> {
        allocateOnOwnCacheLine(Atomic(value))
    }

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
                .reference("Synchronization.Atomic") { benchmark in
                    benchmark.repeatOperation { atomic.pointee.load(ordering: .relaxed) }
                },
            ]
        )
    }

    for (ordering, atomicOrdering, label) in [
        (AtomicMemory.Ordering.relaxed, AtomicStoreOrdering.relaxed, "relaxed"),
        (.sequentiallyConsistent, .sequentiallyConsistent, "sequentiallyConsistent"),
    ] {
        let word = spindleWord(Int64(0))
        let atomic = atomicWord(Int64(0))
        sideBySide(
            group: "atomic.store.64 \(label)",
            spindle: { benchmark in
                var value: Int64 = 0
                benchmark.repeatOperation {
                    value &+= 1
                    AtomicMemory.store(value, to: word, ordering: ordering)
                }
            },
            peers: [
                .reference("Synchronization.Atomic") { benchmark in
                    var value: Int64 = 0
                    benchmark.repeatOperation {
                        value &+= 1
                        atomic.pointee.store(value, ordering: atomicOrdering)
                    }
                },
            ]
        )
    }

    // MARK: Add (returning the new value), 32 and 64 bits

    func addGroup<T: AtomicMemoryWord & AtomicRepresentable>(
        _ type: T.Type, bits: Int,
        _ ordering: AtomicMemory.Ordering, _ atomicOrdering: AtomicUpdateOrdering, _ label: String
    ) where T.AtomicRepresentation == _Atomic32BitStorage || T.AtomicRepresentation == _Atomic64BitStorage {
    }

    do {
        let orderings: [(AtomicMemory.Ordering, AtomicUpdateOrdering, String)] = [
            (.relaxed, .relaxed, "relaxed"),
            (.sequentiallyConsistent, .sequentiallyConsistent, "sequentiallyConsistent"),
        ]
        for (ordering, atomicOrdering, label) in orderings {
            let word32 = spindleWord(Int32(0))
            let atomic32 = atomicWord(Int32(0))
            sideBySide(
                group: "atomic.add.32 \(label)",
                spindle: { benchmark in
                    benchmark.repeatOperation { AtomicMemory.add(3, to: word32, ordering: ordering) }
                },
                peers: [
                    .reference("Synchronization.Atomic") { benchmark in
                        benchmark.repeatOperation {
                            atomic32.pointee.wrappingAdd(3, ordering: atomicOrdering).newValue
                        }
                    },
                ]
            )

            let word64 = spindleWord(Int64(0))
            let atomic64 = atomicWord(Int64(0))
            sideBySide(
                group: "atomic.add.64 \(label)",
                spindle: { benchmark in
                    benchmark.repeatOperation { AtomicMemory.add(3, to: word64, ordering: ordering) }
                },
                peers: [
                    .reference("Synchronization.Atomic") { benchmark in
                        benchmark.repeatOperation {
                            atomic64.pointee.wrappingAdd(3, ordering: atomicOrdering).newValue
                        }
                    },
                ]
            )
        }
    }
}
