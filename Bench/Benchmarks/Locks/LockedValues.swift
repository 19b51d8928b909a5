// A value behind a lock, reached through a closure: Spindle's LockedValue
// beside Synchronization.Mutex<Value> (the reference) and NIO's
// NIOLockedValueBox.
//
// Group "lock.value uncontended": one thread increments an Int inside
// `withLock` in a loop (1,000 per measured iteration); what an uncontended
// caller pays for a guarded update. Mutex is a ~Copyable value, so it lives
// on a cache line of its own (see Peers.swift); LockedValue and
// NIOLockedValueBox allocate their own storage when created.

import Benchmark
import BenchSupport
import NIOConcurrencyHelpers
import Spindle
import Synchronization

/// Registers the lock.value groups; called from the Locks suite's `benchmarks`.
func registerLockedValueBenchmarks(settings: RunSettings) {
    let value = LockedValue(0)
    let mutex = allocateOnOwnCacheLine(Mutex(0))
    let box = NIOLockedValueBox(0)
    sideBySide(
        group: "lock.value uncontended",
        settings: settings,
        spindle: { benchmark in
            benchmark.repeatOperation { value.withLock { $0 &+= 1 } }
        },
        peers: [
            .reference("Synchronization.Mutex") { benchmark in
                benchmark.repeatOperation { mutex.pointee.withLock { $0 &+= 1 } }
            },
            .peer("NIOLockedValueBox") { benchmark in
                benchmark.repeatOperation { box.withLockedValue { $0 &+= 1 } }
            },
        ]
    )
}
